"""Planted-fault backends for the waste checks: each wastes one thing on purpose and is otherwise correct.

They run every layer through one autograd.Function whose faults are switched on by flags:
- discarded_wgrad: backward computes grad_W even for a frozen weight and throws it away;
- extra_activation: forward saves a full-size copy of the layer input besides what backward needs;
- weight_copy: forward saves an FP8-like (float8_e4m3fn) copy of the weight for layers whose dgrad is not needed;
- big_temporary: backward allocates a temporary 64x the size of the layer input.
And whole backends: DiscardedRecompute (each forward GEMM once more, by addmm_, mm(out=) or baddbmm_, thrown away)
and its clean twin SplitK (each Linear as two half-K GEMMs: the same FLOPs, as correct as eager).
"""
from __future__ import annotations

import types

import torch

from te_verify.spec import CaseSpec
from planted_autocast import autocast_dtype


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


class _SplitKLinear(torch.autograd.Function):
    """y = x W^T + b, each GEMM as two half-K GEMMs accumulated into one output (as a split-K kernel does): fprop
    over halves of the input features (x[:, :h] W[:, :h]^T + x[:, h:] W[:, h:]^T), dgrad over halves of the output
    features, wgrad over halves of the rows. Operands are views (of the input, of the weight's storage, of the
    output gradient), nothing is copied, and it saves what eager saves."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        needs_x, needs_w = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if needs_w else None, weight if needs_x else None)
        ctx.has_bias = bias is not None
        h = x.shape[1] // 2
        out = torch.mm(x[:, :h], weight[:, :h].t()) if bias is None else torch.addmm(bias, x[:, :h], weight[:, :h].t())
        return out.addmm_(x[:, h:], weight[:, h:].t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = grad_w = None
        if need_x:
            h = grad.shape[1] // 2
            grad_x = torch.mm(grad[:, :h], weight[:h]).addmm_(grad[:, h:], weight[h:])
        if need_w:
            h = grad.shape[0] // 2
            grad_w = torch.mm(grad[:h].t(), x[:h]).addmm_(grad[h:].t(), x[h:])
        return grad_x, grad_w, grad.sum(0) if need_b else None


def _split_k(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The Linear through _SplitKLinear; eager's linear where a dimension is too small to split. Under autocast its
    operands are first cast to the autocast's dtype, as autocast casts F.linear's (one copy each, saved as eager's)."""
    x2 = x.reshape(-1, x.shape[-1])  # a view where eager's linear flattens with a view too
    if min(x2.shape[0], *self.weight.shape) < 2:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    dtype = autocast_dtype(x)
    operands = [t if t is None or t.dtype == dtype else t.to(dtype) for t in (x2, self.weight, self.bias)]
    out = _SplitKLinear.apply(*operands)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class SplitK:
    """A correct implementation that runs every torch.nn.Linear's fprop, dgrad and wgrad GEMM as two half-K GEMMs
    (another accumulation order, the same FLOPs and memory): it must pass every check (`--backend
    waste_planted:SplitK`)."""

    name = "split_k"
    lane = "torch"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = types.MethodType(_split_k, module)
        return model


def _recompute(op: str, x2: torch.Tensor, weight: torch.Tensor) -> None:
    """The layer's forward GEMM once more, written by `op` into a scratch buffer that is then dropped."""
    x2, w = x2.detach(), weight.detach()
    scratch = torch.zeros(x2.shape[0], w.shape[0], dtype=x2.dtype)
    if op == "addmm_":
        scratch.addmm_(x2, w.t())
    elif op == "mm_out":
        torch.mm(x2, w.t(), out=scratch)
    else:  # baddbmm_
        scratch.unsqueeze(0).baddbmm_(x2.unsqueeze(0), w.t().unsqueeze(0))


class DiscardedRecompute:
    """Every Linear as eager computes it, plus its forward GEMM recomputed with `op` ("addmm_", "mm_out" or
    "baddbmm_") and thrown away: work the case does not need, whatever op wrote it."""

    lane = "torch"

    def __init__(self, op: str = "addmm_") -> None:
        self.op = op
        self.name = f"discarded_recompute_{op}"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        op = self.op

        def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
            _recompute(op, x.reshape(-1, x.shape[-1]), self.weight)
            return torch.nn.functional.linear(x, self.weight, self.bias)

        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = types.MethodType(forward, module)
        return model


def verdicts(spec: CaseSpec, backend) -> dict:
    """The waste checks' verdicts of one run of `spec` on `backend`, by check name (the run must not raise)."""
    from te_verify.checks.waste import waste_verdicts
    from te_verify.probes import default_probes
    from te_verify.run.runner import run_case

    record = run_case(spec, backend, default_probes(backend.name))
    assert record.error is None, record.error
    return {v.check: v for v in waste_verdicts(spec, record, backend.name)}


def failed(found: dict) -> set[str]:
    return {name for name, v in found.items() if not v.ok}
