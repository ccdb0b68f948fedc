"""Planted-fault backends for autocast cases (CaseSpec.autocast): each layer runs one autograd.Function that casts
its input and weight to the autocast's dtype itself, as a custom kernel wrapper does, and is otherwise correct.

- CastLinear() (clean twin, written differently from eager): casts inside the Function, computes x W^T then adds
  the bias as a separate op (eager runs one addmm), keeps the cast input iff the weight trains and the cast weight
  iff the input needs a gradient: what the oracle requires, in another way.
- CastLinear("frozen_weight_copy"): keeps the cast weight of every layer, also where no dgrad needs it (a frozen
  first layer): a saved bf16 copy of a frozen weight.
- CastLinear("second_weight_copy"): keeps the cast weight twice (a second cast, saved beside the first) wherever
  dgrad needs it.
"""
from __future__ import annotations

import functools

import torch

from te_verify.spec import CaseSpec


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the enclosing autocast region runs in on x's device (x's own dtype outside one)."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


class _CastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, faults):
        dtype = autocast_dtype(x)
        needs_x, needs_w = ctx.needs_input_grad[:2]
        xc, wc = x.to(dtype), weight.to(dtype)
        keep_w = wc if (needs_x or "frozen_weight_copy" in faults) else None
        extra = (weight.to(dtype),) if "second_weight_copy" in faults and needs_x else ()
        ctx.save_for_backward(xc if needs_w else None, keep_w, *extra)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        out = xc @ wc.t()
        return out + bias.to(dtype) if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        xc, wc = ctx.saved_tensors[:2]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        rows = grad.reshape(-1, grad.shape[-1])  # (batch, seq) inputs: one row per token
        grad_x = (grad @ wc).to(x_dtype) if need_x else None
        grad_w = (rows.t() @ xc.reshape(-1, xc.shape[-1])).to(w_dtype) if need_w else None
        grad_b = rows.sum(0).to(b_dtype) if need_b else None
        return grad_x, grad_w, grad_b, None


class CastLinear:
    """A backend whose layers run _CastLinear with the given faults (none: the clean twin)."""

    def __init__(self, *faults: str) -> None:
        self.faults = frozenset(faults)
        self.name = "cast_linear" + "".join(f"+{f}" for f in sorted(faults))

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        """Every torch.nn.Linear of the model (a stack's layers, a Llama block's projections and LoRA bases) runs
        _CastLinear; the model's other ops run as they are."""
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = functools.partial(_cast_forward, module, self.faults)
        return model


def _cast_forward(module: torch.nn.Linear, faults: frozenset, x: torch.Tensor) -> torch.Tensor:
    return _CastLinear.apply(x, module.weight, module.bias, faults)
