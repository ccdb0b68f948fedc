"""A TE build that does extra GEMMs (or, under the microbatch runner, saves a copy: SteppedMicrobatchTE) only from the
second iteration on (issue 36, item 1), and its clean twin: TE's
own Python over the tex emulation with `general_gemm` patched (planted_te_gemms) to TE's own GEMM until the backend's
parameters change in place (an optimizer step), then to the planted "recompute" GEMM (every fprop GEMM once more, its
result thrown away) or, in the twin, to the split-K GEMM (two half-K GEMMs: the same FLOPs and operand bytes)."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from planted_iterations import stepped
from planted_te_gemms import GEMMS, ORIGINAL, patched

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.spec import CaseSpec

_AFTER_STEP = [False]  # set by the backend at every call: whether its parameters changed since prepare


def _after_step(mode: str):
    def gemm(*args: Any, **kwargs: Any):
        return (GEMMS[mode] if _AFTER_STEP[0] else ORIGINAL)(*args, **kwargs)
    return gemm


GEMMS.update({f"{mode}_after_step": _after_step(mode) for mode in ("recompute", "split_k", "te")})


class SteppedTE(TEEagerBackend):
    """TE's modules, eager; tells the patched GEMM (`stepping`) whether an optimizer step has run."""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        fn = super().prepare(model, spec)
        changed = stepped(model)
        _AFTER_STEP[0] = False

        def run(x: torch.Tensor) -> torch.Tensor:
            _AFTER_STEP[0] = changed()
            return fn(x)

        return run


@contextlib.contextmanager
def stepping(mode: str) -> Iterator[None]:
    """TE's GEMM before the first step, `mode`'s ("recompute", "split_k" or "te") after it, for a block."""
    with patched(f"{mode}_after_step"):
        try:
            yield
        finally:
            _AFTER_STEP[0] = False


class _KeepsCopy(torch.autograd.Function):
    """The identity, saving a copy of its input for a backward that never reads it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x * 1.0)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _SteppedCallable:
    """A TE stack's callable (is_first_microbatch, backward_dw and the rest delegated) that tells the patched GEMM
    at every forward whether an optimizer step has run; with `keeps_copy`, from then on it also saves a copy of the
    stack's input for backward (_KeepsCopy)."""

    def __init__(self, stack: Any, changed, keeps_copy: bool) -> None:
        self.stack, self.changed, self.keeps_copy = stack, changed, keeps_copy

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        _AFTER_STEP[0] = self.changed()
        if self.keeps_copy and _AFTER_STEP[0]:
            x = _KeepsCopy.apply(x)
        return self.stack(x, is_first_microbatch=is_first_microbatch)

    __call__ = forward

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stack, name)


class SteppedMicrobatchTE(TEEagerBackend):
    """SteppedTE for the microbatch families (run.microbatch): TE's is_first_microbatch and backward_dw kept; with
    `keeps_copy`, a copy of each microbatch's input saved from the first call after a step on."""

    def __init__(self, keeps_copy: bool = False) -> None:
        super().__init__()
        self.keeps_copy = keeps_copy

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        stack = super().prepare(model, spec)
        _AFTER_STEP[0] = False
        return _SteppedCallable(stack, stepped(model), self.keeps_copy)
