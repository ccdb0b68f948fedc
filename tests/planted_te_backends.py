"""Planted TE-lane backends for tests of the lane itself.

`SituGluLinearTE` runs each layer as TE's Linear followed by te.ops' SiTUGLU, which reaches tex.situglu: a tex
function the emulation does not emulate (tex.layernorm_fwd and tex.gelu, this backend's functions before, are
emulated since; te/tecpu/norm.py, activation.py). Its cases must error naming the function and TE's call site, never
pass.
"""
from __future__ import annotations

import torch

from te_verify.te import api as te_api


class SituGluLinearTE:
    """TE's Linear over the model's Linear weights, then te.ops SiTUGLU (the part the emulation lacks)."""

    name = "te_situglu_linear"
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
            layers += [module, te.ops.SiTUGLU()]
        return torch.nn.Sequential(*layers)
