"""`GroupedLinear` (one GEMM per group of rows, weight{i}/bias{i}) and `GroupedMLP`, the fused grouped MLP
equivalent (fc1 groups -> activation -> fc2 groups in one autograd node), on the reference runtime.

Both follow the wgrad return contract of their kind ("grouped_linear", "grouped_mlp") and support
fuse_wgrad_accumulation, delay_wgrad_compute and backward_dw() like `Linear`.
"""
from __future__ import annotations

from collections import deque

import torch

from te_verify.te.reference import wgrad as wg
from te_verify.te.reference.functional import LayerState, linear_backward, linear_forward


def _params(module: torch.nn.Module, prefix: str, n: int) -> list[torch.nn.Parameter | None]:
    return [getattr(module, f"{prefix}{i}", None) for i in range(n)]


def grouped_forward(states, x, splits, weights, biases, need_w, need_d):
    """Per group: rows of x through its weight; returns (out, per-group saved tuples)."""
    outs, saved = [], []
    for i, x_i in enumerate(torch.split(x, list(splits))):
        out, saved_i = linear_forward(states[i], x_i, weights[i], biases[i], need_w[i], need_d)
        outs.append(out)
        saved.append(saved_i)
    return torch.cat(outs), saved


SAVED_PER_GROUP = 5  # functional.linear_forward's saved tuple: x copy, its scale_inv, w copy, its scale_inv, meta


def flatten_saved(saved: list[tuple]) -> list:
    """Per-group saved tuples as one flat list for ctx.save_for_backward (so autograd's hooks see them, as TE's)."""
    return [t for group in saved for t in group]


def unflatten_saved(flat: tuple) -> list[tuple]:
    return [tuple(flat[i:i + SAVED_PER_GROUP]) for i in range(0, len(flat), SAVED_PER_GROUP)]


def grouped_backward(states, grad, splits, saved, need_d, need_w, need_b, defer):
    """Per group backward; returns (dgrad | None, [wgrad or thunk or None], [bgrad or None])."""
    dgrads, wgrads, bgrads = [], [], []
    for i, g_i in enumerate(torch.split(grad, list(splits))):
        d, w, b = linear_backward(states[i], g_i.contiguous(), saved[i], need_d, need_w[i], need_b[i], defer)
        dgrads.append(d)
        wgrads.append(w)
        bgrads.append(b)
    return (torch.cat(dgrads) if need_d else None), wgrads, bgrads


class _GroupedBase(torch.nn.Module):
    """Shared: group states, wgrad routing per the contract, the delayed-wgrad queue and backward_dw."""

    kind = "grouped_linear"
    free_saved_after_backward = False
    backward_dw_overwrites = False
    contract_variant = "intended"

    def _setup(self, fuse: bool, delay: bool, name: str | None) -> None:
        self.fuse_wgrad_accumulation, self.delay_wgrad_compute = fuse, delay
        self.name = name or self.kind
        self.wgrad_store: deque = deque()

    def _new_param(self, shape, dtype, device) -> torch.nn.Parameter:
        p = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
        torch.nn.init.uniform_(p, -shape[-1] ** -0.5, shape[-1] ** -0.5)
        return p

    def route_wgrads(self, weights, wgrads, delay: bool) -> list[torch.Tensor | None]:
        """Per weight: queue, accumulate or return, as the contract of this kind says."""
        fuse, out = self.fuse_wgrad_accumulation, []
        for w, g in zip(weights, wgrads):
            if g is None:
                out.append(None)
            elif delay:
                self.wgrad_store.append((w, g))
                out.append(wg.returned_wgrad(self.kind, w, None, fuse, True, self.contract_variant))
            else:
                if fuse:
                    wg.accumulate_main_grad(w, g)
                out.append(wg.returned_wgrad(self.kind, w, g.to(w.dtype), fuse, False, self.contract_variant))
        return out

    def backward_dw(self) -> None:
        """Run queued wgrad GEMMs (returns early on an empty queue, as TE's grouped modules do)."""
        while self.wgrad_store:
            w, thunk = self.wgrad_store.popleft()
            wg.store_delayed(w, thunk(), self.fuse_wgrad_accumulation, self.backward_dw_overwrites)


class _GroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module, splits, *params):
        n = module.num_gemms
        weights, biases = params[:n], params[n:]
        needs = ctx.needs_input_grad
        need_d, need_w, need_b = needs[0], needs[3:3 + n], needs[3 + n:]
        out, saved = grouped_forward(module.states, x, splits, weights, biases, need_w, need_d)
        ctx.save_for_backward(*flatten_saved(saved))
        ctx.module, ctx.splits = module, splits
        ctx.needs, ctx.weights = (need_d, need_w, need_b), weights
        return out

    @staticmethod
    def backward(ctx, grad):
        m, (need_d, need_w, need_b) = ctx.module, ctx.needs
        delay = m.delay_wgrad_compute
        saved = unflatten_saved(ctx.saved_tensors)
        dgrad, wgrads, bgrads = grouped_backward(m.states, grad, ctx.splits, saved, need_d, need_w, need_b, delay)
        return (dgrad, None, None, *m.route_wgrads(ctx.weights, wgrads, delay), *bgrads)


class GroupedLinear(_GroupedBase):
    """TE's GroupedLinear: `num_gemms` weights; forward(inp, m_splits) splits the rows of inp into groups."""

    kind = "grouped_linear"

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype | None = None, fuse_wgrad_accumulation: bool = False,
                 delay_wgrad_compute: bool = False, device: str | torch.device = "cpu", name: str | None = None) -> None:
        super().__init__()
        dtype = params_dtype or torch.get_default_dtype()
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        for i in range(num_gemms):
            setattr(self, f"weight{i}", self._new_param((out_features, in_features), dtype, device))
            setattr(self, f"bias{i}", self._new_param((out_features,), dtype, device) if bias else None)
        self._setup(fuse_wgrad_accumulation, delay_wgrad_compute, name)
        self.states = [LayerState(f"{self.name}.e{i}", self.free_saved_after_backward) for i in range(num_gemms)]

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        for i, state in enumerate(self.states):
            state.label = f"{self.name}.e{i}" if self.num_gemms > 1 else self.name  # the oracle's site labels
        params = _params(self, "weight", self.num_gemms) + _params(self, "bias", self.num_gemms)
        return _GroupedLinearFunction.apply(inp, self, tuple(m_splits), *params)
