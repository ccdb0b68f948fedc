"""`GroupedMLP`: the fused grouped MLP equivalent (fc1 groups -> activation -> fc2 groups, one autograd node).

TE's fused grouped MLP (ops/fused/grouped_mlp.py) rejects frozen weights in its tests; the reference
supports them and does only the work the intended contract allows.
"""
from __future__ import annotations

import torch

from te_verify.te.reference.functional import LayerState
from te_verify.te.reference.grouped import (_GroupedBase, _params, flatten_saved, grouped_backward, grouped_forward,
                                         unflatten_saved)

ACTIVATIONS = ("identity", "relu")


class _GroupedMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module, splits, *params):
        n = module.num_gemms
        w1, w2, b1, b2 = params[:n], params[n:2 * n], params[2 * n:3 * n], params[3 * n:]
        needs = ctx.needs_input_grad[3:]
        nw1, nw2, nb1, nb2 = needs[:n], needs[n:2 * n], needs[2 * n:3 * n], needs[3 * n:]
        need_d1 = ctx.needs_input_grad[0]
        fc1_backward = need_d1 or any(nw1) or any(nb1)  # does anything flow back through fc1?
        h, saved1 = grouped_forward(module.fc1_states, x, splits, w1, b1, nw1, need_d1)
        a = torch.relu(h) if module.activation == "relu" else h
        out, saved2 = grouped_forward(module.fc2_states, a, splits, w2, b2, nw2, fc1_backward)
        ctx.mask = (h > 0) if module.activation == "relu" and fc1_backward else None
        ctx.save_for_backward(*flatten_saved(saved1), *flatten_saved(saved2))
        ctx.module, ctx.splits = module, splits
        ctx.needs, ctx.weights = (need_d1, fc1_backward, nw1, nw2, nb1, nb2), (w1, w2)
        return out

    @staticmethod
    def backward(ctx, grad):
        m, (need_d1, fc1_backward, nw1, nw2, nb1, nb2) = ctx.module, ctx.needs
        delay = m.delay_wgrad_compute
        flat = ctx.saved_tensors
        saved1, saved2 = unflatten_saved(flat[:len(flat) // 2]), unflatten_saved(flat[len(flat) // 2:])
        grad_a, wg2, bg2 = grouped_backward(m.fc2_states, grad, ctx.splits, saved2, fc1_backward, nw2, nb2, delay)
        dgrad, wg1, bg1 = None, [None] * m.num_gemms, [None] * m.num_gemms
        if fc1_backward:
            grad_h = grad_a * ctx.mask if ctx.mask is not None else grad_a
            dgrad, wg1, bg1 = grouped_backward(m.fc1_states, grad_h, ctx.splits, saved1, need_d1, nw1, nb1, delay)
        w1, w2 = ctx.weights
        return (dgrad, None, None, *m.route_wgrads(w1, wg1, delay), *m.route_wgrads(w2, wg2, delay), *bg1, *bg2)


class GroupedMLP(_GroupedBase):
    """fc1 (in -> hidden) and fc2 (hidden -> out), `num_gemms` groups each, activation in between."""

    kind = "grouped_mlp"

    def __init__(self, num_gemms: int, in_features: int, hidden_features: int, out_features: int,
                 bias: bool = True, *, activation: str = "identity", params_dtype: torch.dtype | None = None,
                 fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False,
                 device: str | torch.device = "cpu", name: str | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"GroupedMLP activation={activation!r}: expected one of {ACTIVATIONS}")
        dtype = params_dtype or torch.get_default_dtype()
        self.num_gemms, self.activation = num_gemms, activation
        for i in range(num_gemms):
            setattr(self, f"fc1_weight{i}", self._new_param((hidden_features, in_features), dtype, device))
            setattr(self, f"fc2_weight{i}", self._new_param((out_features, hidden_features), dtype, device))
            setattr(self, f"fc1_bias{i}", self._new_param((hidden_features,), dtype, device) if bias else None)
            setattr(self, f"fc2_bias{i}", self._new_param((out_features,), dtype, device) if bias else None)
        self._setup(fuse_wgrad_accumulation, delay_wgrad_compute, name)
        self.fc1_states = [LayerState("", self.free_saved_after_backward) for _ in range(num_gemms)]
        self.fc2_states = [LayerState("", self.free_saved_after_backward) for _ in range(num_gemms)]
        self.fc1_name, self.fc2_name = f"{self.name}.fc1", f"{self.name}.fc2"

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        for states, label in ((self.fc1_states, self.fc1_name), (self.fc2_states, self.fc2_name)):
            for i, state in enumerate(states):
                state.label = f"{label}.e{i}" if self.num_gemms > 1 else label
        n = self.num_gemms
        params = (_params(self, "fc1_weight", n) + _params(self, "fc2_weight", n)
                  + _params(self, "fc1_bias", n) + _params(self, "fc2_bias", n))
        return _GroupedMLPFunction.apply(inp, self, tuple(m_splits), *params)
