"""Deterministic models and inputs from a spec: every backend of a case starts bit-identical.

Values are drawn on the CPU from a seeded generator, then moved to the run's device (te_verify.device), so a
case starts from the same numbers on every device; every tensor names its device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from te_verify import device as run_device
from te_verify.spec import CaseSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU = torch.device("cpu")  # where the seeded draws happen (the generators are CPU generators)


@dataclass
class CaseInputs:
    """The model input and the cotangent fed to every backward pass."""

    x: torch.Tensor
    grad_output: torch.Tensor


class Experts(torch.nn.Module):
    """One MoE layer without routing: expert k ("e<k>") multiplies the k-th equal share of the rows.

    `frozen_experts` are kept frozen by set_frozen whatever the layer's mask says (MoE PEFT)."""

    def __init__(self, experts: list[torch.nn.Linear], frozen_experts: tuple[int, ...]) -> None:
        super().__init__()
        for k, expert in enumerate(experts):
            self.add_module(f"e{k}", expert)
        self.frozen_experts = frozen_experts

    @property
    def experts(self) -> list[torch.nn.Linear]:
        return list(self.children())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        chunks = rows.chunk(len(self.experts))
        out = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, chunks)])
        return out.reshape(*x.shape[:-1], -1)


def _seeded_linear(fan_in: int, fan_out: int, bias: bool, gen: torch.Generator, dtype: torch.dtype,
                   device: torch.device) -> torch.nn.Linear:
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, device=CPU)
    bound = fan_in ** -0.5  # nn.Linear's default init range, drawn from our own generator
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=gen)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=gen)
    return layer.to(device=device, dtype=dtype)


def build_model(spec: CaseSpec, device: torch.device | None = None) -> torch.nn.Sequential:
    """A stack of torch.nn.Linear layers (or Experts of them) named "0", "1", ...; weights drawn from
    `spec.seed`, all trainable, on `device` (default: the run's)."""
    device = device or run_device.active()
    gen = torch.Generator(device=CPU).manual_seed(spec.seed)
    dtype = TORCH_DTYPES[spec.dtype]
    experts = spec.te.experts if spec.te is not None else 1
    layers = []
    for fan_in, fan_out in zip(spec.widths, spec.widths[1:]):
        group = [_seeded_linear(fan_in, fan_out, spec.has_bias, gen, dtype, device) for _ in range(experts)]
        layers.append(group[0] if experts == 1 else Experts(group, spec.te.frozen_experts))
    for i in (spec.te.tied[1:] if spec.te is not None else ()):
        layers[i].weight = layers[spec.te.tied[0]].weight  # tied: one Parameter, used by every listed layer
    return torch.nn.Sequential(*layers)


def make_inputs(spec: CaseSpec, batch_shape: tuple[int, ...] | None = None,
                device: torch.device | None = None) -> CaseInputs:
    """Seeded input and output cotangent on `device` (default: the run's); `batch_shape` overrides the spec's."""
    device = device or run_device.active()
    gen = torch.Generator(device=CPU).manual_seed(spec.seed + 1)
    dtype = TORCH_DTYPES[spec.dtype]
    shape = tuple(batch_shape or spec.batch_shape)
    x = torch.randn(*shape, spec.widths[0], generator=gen, device=CPU).to(device=device, dtype=dtype)
    grad_output = torch.randn(*shape, spec.widths[-1], generator=gen, device=CPU).to(device=device, dtype=dtype)
    return CaseInputs(x.requires_grad_(spec.input_requires_grad), grad_output)


def set_frozen(layers: Iterable[torch.nn.Module], weight_frozen: tuple[bool, ...],
               bias_frozen: tuple[bool, ...] | None) -> None:
    """Apply freeze masks to linear layers, in order (a built model iterates its layers; wrappers expose theirs)."""
    for i, layer in enumerate(layers):
        for k, linear in enumerate(getattr(layer, "experts", [layer])):
            frozen_expert = k in getattr(layer, "frozen_experts", ())
            linear.weight.requires_grad_(not (weight_frozen[i] or frozen_expert))
            if bias_frozen is not None and getattr(linear, "bias", None) is not None:
                linear.bias.requires_grad_(not (bias_frozen[i] or frozen_expert))


def unfreeze_all(layers: Iterable[torch.nn.Module]) -> None:
    for layer in layers:
        for p in layer.parameters():
            p.requires_grad_(True)
