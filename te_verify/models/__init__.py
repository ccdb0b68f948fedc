"""Deterministic models and inputs from a spec, one module per family: every backend of a case starts
bit-identical. The linear stack (stack.py) serves specs without `model`; ModelConfig.kind names the others."""
from __future__ import annotations

from typing import Iterable

import torch

from te_verify import device as run_device
from te_verify.models import hf_peft, litgpt_lora, llama, stack
from te_verify.models.schedule import apply_schedule, masks_at
from te_verify.models.seeded import CPU, TORCH_DTYPES, CaseInputs
from te_verify.models.stack import Experts, set_frozen
from te_verify.spec import CaseSpec

# ModelConfig.kind -> its module (build, make_inputs, set_frozen); spec.MODEL_KINDS says what each can express.
FAMILIES = {"llama": llama, "hf_peft": hf_peft, "litgpt_lora": litgpt_lora}

__all__ = ["CPU", "TORCH_DTYPES", "CaseInputs", "Experts", "apply_schedule", "build_model", "freeze",
           "frozen_at_backward", "make_inputs", "masks_at", "set_frozen", "unfreeze_all"]


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


def freeze(model: torch.nn.Module, spec: CaseSpec) -> None:
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
