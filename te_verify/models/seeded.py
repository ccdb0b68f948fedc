"""What every model family shares: seeded draws on the CPU, the dtype table, the case's input and cotangent.

Values are drawn on the CPU from a seeded generator, then moved to the run's device, so a case starts from the
same numbers on every device and every backend; every tensor names its device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU = torch.device("cpu")  # where the seeded draws happen (the generators are CPU generators)


@dataclass
class CaseInputs:
    """The model input and the cotangent fed to every backward pass."""

    x: torch.Tensor
    grad_output: torch.Tensor


def seeded_linear(fan_in: int, fan_out: int, bias: bool, gen: torch.Generator, dtype: torch.dtype,
                  device: torch.device) -> torch.nn.Linear:
    """nn.Linear with its default init range, drawn from `gen`."""
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, device=CPU)
    seeded_fill(layer.weight, fan_in ** -0.5, gen)
    if layer.bias is not None:
        seeded_fill(layer.bias, fan_in ** -0.5, gen)
    return layer.to(device=device, dtype=dtype)


def seeded_fill(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    """Fill a CPU tensor uniformly in [-bound, bound) from `gen`."""
    with torch.no_grad():
        t.uniform_(-bound, bound, generator=gen)


def seeded_randn(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, device: torch.device
                 ) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=CPU).to(device=device, dtype=dtype)
