"""TE builds for freeze schedules in the TE lane (family te_schedule): TE's own Python over the tex emulation, each
layer called with its own `is_first_microbatch` or its weight's requires_grad seen as the build decides, so the fault
sits where TE's FP8 weight caching and wgrad decision live.

- CachesFrozenCopies (planted): quantizes the weights frozen at prepare once (TE Linear's FP8 weight cache:
  is_first_microbatch True on the first call, False after) and never looks at the flags again: a weight unfrozen
  later trains, but its forward keeps reading the FP8 copy made while it was frozen.
- StaleWgrad (planted): decides which weights get a wgrad from the flags at prepare: a weight frozen later is shown
  to TE as trainable during its forward, so TE saves its input and runs its wgrad GEMM (autograd then drops the
  result: the parameter no longer requires grad, so its .grad stays None and only the work is wrong).
- RestartsScalingState (planted): re-creates each layer's delayed-scaling state at iteration 2 (thunder's restart).
- QuantizesEveryCall (the clean twin): the same per-layer calls with neither fault: each layer's weight quantized
  anew at every call (is_first_microbatch None) and its requires_grad as it is. (A twin keeping TE's FP8 weight cache
  across steps, is_first_microbatch True once per step, holds TE's workspace between iterations, which
  memory_retained counts: not a clean twin of a single-microbatch case.)
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from te_verify.backends.te_eager import TEEagerBackend, TEStack
from te_verify.spec import CaseSpec


class PerLayerStack(TEStack):
    """te_eager's TEStack with each layer's own is_first_microbatch (`flags(i, layer)`) and context around its call
    (`around(i, layer)`); the same modules, so the probes read it as they read te_eager's."""

    def __init__(self, stack: TEStack, flags: Callable[[int, torch.nn.Module], bool | None],
                 around: Callable[[int, torch.nn.Module], contextlib.AbstractContextManager] | None = None) -> None:
        super().__init__(list(stack.layers), stack.kind, stack.api, stack.recipe)
        self.flags, self.around = flags, around or (lambda i, layer: contextlib.nullcontext())

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        with self.api.autocast(enabled=True, recipe=self.recipe) if self.recipe else contextlib.nullcontext():
            rows = x.reshape(-1, x.shape[-1])
            for i, layer in enumerate(self.layers):
                with self.around(i, layer):
                    rows = self.kind.call(layer, rows, self.flags(i, layer))
        return rows.reshape(*x.shape[:-1], -1)


class CachesFrozenCopies(TEEagerBackend):
    name = "planted_caches_frozen_copies"

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        stack = super().prepare(model, spec)
        frozen = {i for i, layer in enumerate(stack.layers) if not layer.weight.requires_grad}
        made: set[int] = set()

        def flag(i: int, layer: torch.nn.Module) -> bool | None:
            if i not in frozen:
                return None
            first = i not in made
            made.add(i)
            return first
        return PerLayerStack(stack, flag)


class StaleWgrad(TEEagerBackend):
    name = "planted_stale_wgrad"

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        stack = super().prepare(model, spec)
        trained = {i for i, layer in enumerate(stack.layers) if layer.weight.requires_grad}

        @contextlib.contextmanager
        def shown_trainable(i: int, layer: torch.nn.Module):
            stale = i in trained and not layer.weight.requires_grad
            layer.weight.requires_grad_(stale or layer.weight.requires_grad)
            try:
                yield
            finally:
                layer.weight.requires_grad_(layer.weight.requires_grad and not stale)
        return PerLayerStack(stack, lambda i, layer: None, shown_trainable)


class QuantizesEveryCall(TEEagerBackend):
    name = "quantizes_every_call"

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return PerLayerStack(super().prepare(model, spec), lambda i, layer: None)


class RestartsScalingState(TEEagerBackend):
    """Planted: at its second call (iteration 2's forward, one microbatch per iteration) each layer drops its
    delayed-scaling state and TE makes a new one, with nothing to inherit (scale 1, empty amax history), as
    thunder's TE executor does after a recompile: every slot's own model starts fresh with it."""

    name = "planted_restarts_scaling_state"

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager  # TE's Python, booted by then

        calls: dict[int, int] = {}

        @contextlib.contextmanager
        def restarted(i: int, layer: torch.nn.Module):
            calls[i] = calls.get(i, 0) + 1
            if calls[i] == 2:
                # The state and its place in TE's global amax buffers, so the new state is updated as a first one.
                for key in ("scaling_fwd", "scaling_bwd", FP8GlobalStateManager.get_buffer_info()):
                    layer.fp8_meta.pop(key, None)
                # Both flags down: init_fp8_metadata and set_meta_tensor then build a new RecipeState.
                layer.fp8_initialized = layer.fp8_meta_tensors_initialized = False
            yield
        return PerLayerStack(super().prepare(model, spec), lambda i, layer: None, restarted)
