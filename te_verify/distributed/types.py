"""What every wrapper and training engine shares: the wrapped model and how to observe it (Wrapped), a parameter's
slot before wrapping, the helpers that read parameters by slot, and what an engine declares (Engine)."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
from torch import nn

from te_verify.training import TrainStep
from te_verify.models import family_of
from te_verify.spec import CaseSpec


# A range of a collective's tensor an engine's layout names: (parameter name, "values" or "grad", first element,
# end element).
Owned = tuple[str, str, int, int]


class WrapperError(ValueError):
    """An unknown wrapper or option; the message names it."""


@dataclass
class Wrapped:
    """A wrapped model and how to observe it."""

    # The callable under test: x -> output.
    module: Callable[[torch.Tensor], torch.Tensor]
    # The units in model order (the very modules the wrapper runs): a stack's nn.Linear layers, a family's blocks.
    layers: list[nn.Module]
    # Full (unsharded) gradients by qualified parameter name in the unwrapped model ("<layer>.<weight|bias>" for a
    # stack, e.g. "blocks.0.attn.q.lora_a.weight" for a family); may run collectives, so call after counting stops.
    full_grads: Callable[[], dict[str, torch.Tensor | None]]
    # Full (unsharded) parameter values, keyed the same way: what the run left in the model.
    full_params: Callable[[], dict[str, torch.Tensor | None]]
    # Bytes of gathered parameter storage per layer now; None when the wrapper cannot be observed.
    gathered_bytes: Callable[[], list[int]] | None = None
    # Factor by which the wrapper divides the summed gradients (it averages over ranks).
    grad_divisor: float = 1.0
    # Anything the rank must keep alive for the case (meshes, process groups).
    keep: list = field(default_factory=list)
    # The unwrapped model object (set by case_runner.prepare): its linears, in module order, are the oracle's sites.
    model: nn.Module | None = None
    # A training engine's step (te_verify.training): its backward, finish, optimizer step and state. None for a
    # wrapper that only computes gradients (DDP, FSDP): the lane then runs one plain forward and backward.
    train: TrainStep | None = None
    # The layout of the buffers it communicates: a collective's tensor -> which parameter owns which element range
    # of it (Owned), or None where the tensor is not on one of its buffers. Where it answers, what the ranges name is
    # what the tensor carries (nothing for padding); None here: storage and content matching name it
    # (distributed.rank.carried).
    buffer_layout: Callable[[torch.Tensor], list[Owned] | None] | None = None
    # The wrapper's documented context for a microbatch whose gradients must not be reduced yet (DDP's and FSDP's
    # no_sync, FSDP2's set_requires_gradient_sync(False)); None: it has none (CaseSpec.microbatches is refused).
    no_sync: Callable[[], ContextManager] | None = None


# A parameter's place, taken before wrapping: (qualified name, owning module, attribute). Reading the attribute
# after wrapping reaches the wrapper's parameter (FSDP2's DTensor, FSDP1's use_orig_params view) by its old name.
Slot = tuple[str, nn.Module, str]


def param_slots(model: nn.Module) -> list[Slot]:
    """Every parameter's slot, in module order (a stack: "<layer>.<weight|bias>")."""
    return [(f"{prefix}.{attr}" if prefix else attr, module, attr)
            for prefix, module in model.named_modules() for attr, _ in module.named_parameters(recurse=False)]


def units_of(model: nn.Module, spec: CaseSpec) -> list[nn.Module]:
    """What a wrapper wraps one by one: a stack's layers, a model family's blocks (run in sequence)."""
    return list(model) if spec.model is None else family_of(spec).blocks(model)


def options(spec: CaseSpec) -> dict:
    return dict(spec.dist.options)


def param_tensors(slots: list[Slot], of: Callable[[nn.Parameter], torch.Tensor | None]
                  ) -> dict[str, torch.Tensor | None]:
    """`of(parameter)` (its gradient, or itself) for every parameter, cloned, by qualified name."""
    out = {}
    for name, module, attr in slots:
        t = of(getattr(module, attr))
        out[name] = None if t is None else t.detach().clone()
    return out


def grad_of(p: nn.Parameter) -> torch.Tensor | None:
    return p.grad


def value_of(p: nn.Parameter) -> torch.Tensor:
    return p


def storage_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    return t.untyped_storage().nbytes()


@dataclass(frozen=True)
class Engine:
    """One training engine as the lane sees it."""

    # Its backend name, the wrapper part of its case ids (spec.dist.wrapper).
    name: str
    # (seeded model, spec) -> Wrapped with its `train` set; runs inside a rank.
    wrap: Callable
    # spec -> whether it shards parameters (all-gathers them for compute).
    shards: Callable[[CaseSpec], bool]
    # spec -> whether it frees gathered parameters after forward and gathers them again for backward.
    reshards_after_forward: Callable[[CaseSpec], bool]
    # The CPU steps its wrap applies on a CPU rank (compat.cuda_stand_in), for the report header written by the caller.
    cpu_steps: tuple[str, ...] = ()
    # Compatibility steps its wrap applies on every device (listed in the report header too).
    steps: tuple[str, ...] = ()
    # The package it imports (its cases skip, naming it, where it is not installed).
    package: str = ""
    # spec -> gradient reductions per iteration by design: 1, or one per microbatch where the engine keeps only its
    # partition of the gradients (ZeRO-2/3, Megatron-FSDP's gradient-sharding strategies: they must reduce each
    # microbatch's gradients into it, as their documentation says).
    reductions: Callable[[CaseSpec], int] = lambda spec: 1
    # spec -> the dtype it casts the model's parameters to in place when it wraps (DeepSpeed's bf16 section), so that
    # training starts from their rounding; None: it leaves them as they are.
    casts_params_to: Callable[[CaseSpec], torch.dtype | None] = lambda spec: None

    def unavailable(self) -> str | None:
        """Why its cases cannot run here (None if they can)."""
        if self.package and importlib.util.find_spec(self.package) is None:
            return f"{self.package} is not installed (README: the install commands)"
        return None
