"""Deterministic models and inputs from a spec, one module per family: every backend of a case starts
bit-identical. The linear stack (stack.py) serves specs without `model`; ModelConfig.kind names the others."""
from __future__ import annotations

from typing import Iterable

import torch

from te_verify import device as run_device
from te_verify.models import llama, stack
from te_verify.models.seeded import CPU, TORCH_DTYPES, CaseInputs
from te_verify.models.stack import Experts, set_frozen
from te_verify.spec import CaseSpec

FAMILIES = {"llama": llama}  # ModelConfig.kind -> its module (build, make_inputs, set_frozen)

__all__ = ["CPU", "TORCH_DTYPES", "CaseInputs", "Experts", "build_model", "freeze", "make_inputs", "set_frozen",
           "unfreeze_all"]


def build_model(spec: CaseSpec, device: torch.device | None = None) -> torch.nn.Module:
    """The spec's seeded model, every parameter trainable, on `device` (default: the run's)."""
    device = device or run_device.active()
    if spec.model is None:
        return stack.build(spec, device)
    return FAMILIES[spec.model.kind].build(spec, device)


def make_inputs(spec: CaseSpec, batch_shape: tuple[int, ...] | None = None,
                device: torch.device | None = None) -> CaseInputs:
    """Seeded input and output cotangent on `device` (default: the run's); `batch_shape` overrides the spec's."""
    device = device or run_device.active()
    shape = tuple(batch_shape or spec.batch_shape)
    if spec.model is not None:
        return FAMILIES[spec.model.kind].make_inputs(spec, shape, device)
    gen = torch.Generator(device=CPU).manual_seed(spec.seed + 1)
    dtype = TORCH_DTYPES[spec.dtype]
    x = torch.randn(*shape, spec.widths[0], generator=gen, device=CPU).to(device=device, dtype=dtype)
    grad_output = torch.randn(*shape, spec.widths[-1], generator=gen, device=CPU).to(device=device, dtype=dtype)
    return CaseInputs(x.requires_grad_(spec.input_requires_grad), grad_output)


def freeze(model: torch.nn.Module, spec: CaseSpec) -> None:
    """Apply the spec's freezing: the stack's masks in layer order, or the family's rule."""
    if spec.model is None:
        set_frozen(model, spec.weight_frozen, spec.bias_frozen)
    else:
        FAMILIES[spec.model.kind].set_frozen(model, spec.model)


def unfreeze_all(layers: Iterable[torch.nn.Module]) -> None:
    for layer in layers:
        for p in layer.parameters():
            p.requires_grad_(True)
