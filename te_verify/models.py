"""Deterministic models and inputs from a spec: every backend of a case starts bit-identical."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from te_verify.spec import CaseSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class CaseInputs:
    """The model input and the cotangent fed to every backward pass."""

    x: torch.Tensor
    grad_output: torch.Tensor


def build_model(spec: CaseSpec) -> torch.nn.Sequential:
    """A stack of torch.nn.Linear layers named "0", "1", ...; weights drawn from `spec.seed`, all trainable."""
    gen = torch.Generator().manual_seed(spec.seed)
    dtype = TORCH_DTYPES[spec.dtype]
    layers = []
    for fan_in, fan_out in zip(spec.widths, spec.widths[1:]):
        layer = torch.nn.Linear(fan_in, fan_out, bias=spec.has_bias)
        bound = fan_in ** -0.5  # nn.Linear's default init range, drawn from our own generator
        with torch.no_grad():
            layer.weight.uniform_(-bound, bound, generator=gen)
            if layer.bias is not None:
                layer.bias.uniform_(-bound, bound, generator=gen)
        layers.append(layer.to(dtype))
    return torch.nn.Sequential(*layers)


def make_inputs(spec: CaseSpec, batch_shape: tuple[int, ...] | None = None) -> CaseInputs:
    """Seeded input and output cotangent; `batch_shape` overrides the spec's (a rank's shard)."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    dtype = TORCH_DTYPES[spec.dtype]
    shape = tuple(batch_shape or spec.batch_shape)
    x = torch.randn(*shape, spec.widths[0], generator=gen).to(dtype)
    grad_output = torch.randn(*shape, spec.widths[-1], generator=gen).to(dtype)
    return CaseInputs(x.requires_grad_(spec.input_requires_grad), grad_output)


def set_frozen(layers: Iterable[torch.nn.Module], weight_frozen: tuple[bool, ...],
               bias_frozen: tuple[bool, ...] | None) -> None:
    """Apply freeze masks to linear layers, in order (a built model iterates its layers; wrappers expose theirs)."""
    for i, layer in enumerate(layers):
        layer.weight.requires_grad_(not weight_frozen[i])
        if bias_frozen is not None and getattr(layer, "bias", None) is not None:
            layer.bias.requires_grad_(not bias_frozen[i])


def unfreeze_all(layers: Iterable[torch.nn.Module]) -> None:
    for layer in layers:
        for p in layer.parameters():
            p.requires_grad_(True)
