"""LoRA adapters (LitGPT's LoRALinear): a frozen base linear plus trainable low-rank A and B.

out = base(x) + lora_b(lora_a(x)) * alpha / r. The three linears are modules of their own ("base", "lora_a",
"lora_b"), so every one is a linear site the oracle and the probes name.
"""
from __future__ import annotations

import torch

from te_verify.models.seeded import seeded_fill, seeded_linear


class LoRALinear(torch.nn.Module):
    def __init__(self, base: torch.nn.Module, in_features: int, out_features: int, rank: int, alpha: int,
                 gen: torch.Generator, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.lora_a = seeded_linear(in_features, rank, False, gen, dtype, device)
        self.lora_b = seeded_linear(rank, out_features, False, gen, dtype, device)
        # LitGPT starts B at zero; a non-zero B (as after some training) makes A's gradient non-zero, so a
        # backend that drops or mangles it is seen in the values, not only in None-ness.
        with torch.no_grad():
            b = torch.empty_like(self.lora_b.weight, device="cpu", dtype=torch.float32)
            seeded_fill(b, rank ** -0.5, gen)
            self.lora_b.weight.copy_(b)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scaling


def is_adapter(name: str) -> bool:
    """Whether a parameter's qualified name is an adapter's (what PEFT trains)."""
    return ".lora_a." in name or ".lora_b." in name
