"""Deterministic models and inputs from a spec, one module per family: every backend of a case starts
bit-identical. The linear stack (stack.py) serves specs without `model`; ModelConfig.kind names the others."""
from __future__ import annotations

import functools
from typing import Iterable

import torch

from te_verify import device as run_device
from te_verify.models import hf_peft, litgpt_lora, llama, stack
from te_verify.models.schedule import change_at, masks_at, spec_at
from te_verify.models.seeded import CPU, TORCH_DTYPES, CaseInputs
from te_verify.models.stack import Experts, set_frozen
from te_verify.spec import CaseSpec

# ModelConfig.kind -> its module (build, make_inputs, set_frozen); spec.MODEL_KINDS says what each can express.
FAMILIES = {"llama": llama, "hf_peft": hf_peft, "litgpt_lora": litgpt_lora}

__all__ = ["CPU", "TORCH_DTYPES", "CaseInputs", "Experts", "apply_schedule", "build_model", "freeze",
           "frozen_at_backward", "make_inputs", "masks_at", "new_state_bytes", "set_frozen", "spec_at", "unfreeze_all"]


def family_of(spec: CaseSpec):
    """The module that builds the spec's model: the stack, or its ModelConfig.kind's."""
    return stack if spec.model is None else FAMILIES[spec.model.kind]


def build_model(spec: CaseSpec, device: torch.device | None = None) -> torch.nn.Module:
    """The spec's seeded model, every parameter trainable, on `device` (default: the run's)."""
    return family_of(spec).build(spec, device or run_device.active())


def make_inputs(spec: CaseSpec, batch_shape: tuple[int, ...] | None = None,
                device: torch.device | None = None) -> CaseInputs:
    """Seeded input and output cotangent on `device` (default: the run's); `batch_shape` overrides the spec's."""
    return family_of(spec).make_inputs(spec, tuple(batch_shape or spec.batch_shape), device or run_device.active())


def freeze(model: torch.nn.Module | Iterable[torch.nn.Module], spec: CaseSpec) -> None:
    """Apply the spec's freezing: the stack's masks in layer order, or the family's rule."""
    if spec.model is None:
        set_frozen(model, spec.weight_frozen, spec.bias_frozen)
    else:
        FAMILIES[spec.model.kind].set_frozen(model, spec.model)


def frozen_at_backward(spec: CaseSpec, device: torch.device | None = None) -> torch.nn.Module:
    """The spec's model with requires_grad as in force when backward runs (built trainable; frozen unless the spec
    unfreezes everything after preparing)."""
    model = build_model(spec, device)
    if spec.freeze_timing != "unfreeze_after":
        freeze(model, spec)
    return model


def unfreeze_all(layers: Iterable[torch.nn.Module]) -> None:
    for layer in layers:
        for p in layer.parameters():
            p.requires_grad_(True)


def apply_schedule(layers: torch.nn.Module | Iterable[torch.nn.Module], spec: CaseSpec, iteration: int) -> bool:
    """Before `iteration`: set a built model (or the stack's layers a wrapper runs) to the trainable set in force
    then (models.schedule.spec_at), where the schedule changes it; whether it did."""
    if change_at(spec, iteration) is None:
        return False
    freeze(layers, spec_at(spec, iteration))
    return True


@functools.lru_cache(maxsize=64)
def _trained(spec: CaseSpec, iteration: int) -> dict[str, int]:
    """Bytes of every parameter that trains in `iteration`, by name, from the spec's model built on the CPU."""
    model = frozen_at_backward(spec_at(spec, iteration), CPU)
    return {name: p.numel() * p.element_size() for name, p in model.named_parameters() if p.requires_grad}


def new_state_bytes(spec: CaseSpec, iteration: int) -> int:
    """Bytes of optimizer state (SGD's momentum, one element per parameter element, in the parameter's dtype) the step
    of `iteration` makes for the first time: the parameters trainable then and in no iteration before it (none
    without a schedule: the first step made every state)."""
    if not spec.schedule:
        return 0
    before = {name for k in range(1, iteration) for name in _trained(spec, k)}
    return sum(size for name, size in _trained(spec, iteration).items() if name not in before)
