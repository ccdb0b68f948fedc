"""Planted TE-lane backends for tests of the lane itself.

`SoftmaxLinearTE` runs each layer as TE's Linear followed by TE's ScaledSoftmax (attention's
`scaled_softmax_forward`), which reaches tex.scaled_softmax_forward: a tex function the emulation does not emulate
(tex.layernorm_fwd, tex.gelu, tex.situglu and tex.scaled_srelu, this backend's functions before, are emulated
since; te/tecpu/norm.py, activation.py, scaled_activation.py). Its cases must error naming the function and TE's
call site, never pass.
"""
from __future__ import annotations

import importlib

import torch

from te_verify.te import api as te_api

SOFTMAX = "transformer_engine.pytorch.attention.dot_product_attention.softmax"


class _ScaledSoftmax(torch.nn.Module):
    """TE's ScaledSoftmax forward (scale 1) over the layer's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return importlib.import_module(SOFTMAX).scaled_softmax_forward(x, 1.0)


class SoftmaxLinearTE:
    """TE's Linear over the model's Linear weights, then TE's ScaledSoftmax (the part the emulation lacks)."""

    name = "te_softmax_linear"
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
            layers += [module, _ScaledSoftmax()]
        return torch.nn.Sequential(*layers)
