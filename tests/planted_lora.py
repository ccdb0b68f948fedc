"""Planted LoRA faults: eager with one adapter layer changed, each a fault a site-level check must name."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from te_verify.models.lora import LoRALinear


class _Base(torch.autograd.Function):
    """A frozen base linear whose backward does what the fault says."""

    @staticmethod
    def forward(ctx, x, weight, fault):
        ctx.fault = fault
        ctx.save_for_backward(x, weight, *((x.clone(),) if fault == "save_twice" else ()))
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors[:2]
        if ctx.fault == "discarded_wgrad":  # the frozen weight's wgrad, computed and thrown away
            grad.flatten(0, -2).t().mm(x.flatten(0, -2))
        return grad.matmul(weight), None, None


class PlantedLoRA:
    """Eager, with every adapter's base replaced per `fault`: "discarded_wgrad" (a wgrad GEMM for the frozen base),
    "save_twice" (the base's input saved again as a copy) or "drop_b" (B's weight used detached: no gradient)."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.name = f"planted_lora_{fault}"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec):
        for module in model.modules():
            if isinstance(module, LoRALinear):
                self._plant(module)
        return model

    def _plant(self, lora: LoRALinear) -> None:
        if self.fault == "drop_b":
            b = lora.lora_b
            b.forward = lambda x: F.linear(x, b.weight.detach())
        else:
            base = lora.base
            base.forward = lambda x: _Base.apply(x, base.weight, self.fault)
