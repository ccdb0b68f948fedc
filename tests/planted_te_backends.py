"""Planted TE-lane backends for tests of the lane itself.

`ScaledSReLULinearTE` runs each layer as TE's Linear followed by te.ops' ScaledSReLU (unit row scales), which
reaches tex.scaled_srelu: a tex function the emulation does not emulate (tex.layernorm_fwd, tex.gelu and
tex.situglu, this backend's functions before, are emulated since; te/tecpu/norm.py, activation.py). Its cases must
error naming the function and TE's call site, never pass.
"""
from __future__ import annotations

import torch

from te_verify.te import api as te_api


class _UnitScaledSReLU(torch.nn.Module):
    """te.ops ScaledSReLU with every row's scale 1 (its second input)."""

    def __init__(self, op: torch.nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device))


class ScaledSReLULinearTE:
    """TE's Linear over the model's Linear weights, then te.ops ScaledSReLU (the part the emulation lacks)."""

    name = "te_scaled_srelu_linear"
    lane = "te"

    def available(self) -> tuple[bool, str]:
        return te_api.active().runs_te_python, "needs TE's Python"

    def prepare(self, model: torch.nn.Module, spec):
        te = te_api.active().api.module
        layers = []
        for layer in model:
            module = te.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                               params_dtype=layer.weight.dtype)
            module.weight, module.bias = layer.weight, layer.bias
            layers += [module, _UnitScaledSReLU(te.ops.ScaledSReLU())]
        return torch.nn.Sequential(*layers)
