"""Planted-fault backends for the waste checks: each wastes one thing on purpose and is otherwise correct.

They run every layer through one autograd.Function whose faults are switched on by flags:
- discarded_wgrad: backward computes grad_W even for a frozen weight and throws it away;
- extra_activation: forward saves a full-size copy of the layer input besides what backward needs;
- weight_copy: forward saves an FP8-like (float8_e4m3fn) copy of the weight for layers whose dgrad is not needed;
- big_temporary: backward allocates a temporary 64x the size of the layer input.
"""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec


class _PlantedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, faults):
        ctx.faults = faults
        needs_x, needs_w = x.requires_grad, weight.requires_grad
        extra = []
        if "extra_activation" in faults:
            extra.append(x * 1.0)
        if "weight_copy" in faults and not needs_x:
            extra.append(weight.detach().to(torch.float8_e4m3fn))
        keep_x = x if (needs_w or "discarded_wgrad" in faults) else None
        ctx.save_for_backward(keep_x, weight if needs_x else None, *extra)
        out = x @ weight.t()
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors[:2]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if "big_temporary" in ctx.faults:
            torch.zeros(64 * grad.numel(), dtype=grad.dtype).add_(1.0)
        grad_x = grad @ weight if need_x else None
        grad_w = grad.t() @ x if (need_w or "discarded_wgrad" in ctx.faults) else None
        grad_b = grad.sum(0) if need_b else None
        return grad_x, grad_w if need_w else None, grad_b, None


class PlantedBackend:
    """A backend whose layers run _PlantedLinear with the given faults."""

    def __init__(self, *faults: str) -> None:
        self.faults = frozenset(faults)
        self.name = "planted_" + "+".join(sorted(faults))

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        faults = self.faults

        def run(x: torch.Tensor) -> torch.Tensor:
            for layer in model:
                x = _PlantedLinear.apply(x, layer.weight, layer.bias, faults)
            return x

        return run
