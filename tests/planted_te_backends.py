"""Planted TE-lane backends for tests of the lane itself.

`LayerNormLinearTE` runs each layer as TE's LayerNormLinear, whose layer norm reaches tex.layernorm_fwd: a tex
function the emulation does not emulate. Its cases must error naming the function and TE's call site, never pass.
"""
from __future__ import annotations

import torch

from te_verify.te import api as te_api


class LayerNormLinearTE:
    """TE's LayerNormLinear over the model's Linear weights (the layer norm is the part the emulation lacks)."""

    name = "te_layernorm_linear"
    lane = "te"

    def available(self) -> tuple[bool, str]:
        return te_api.active().runs_te_python, "needs TE's Python"

    def prepare(self, model: torch.nn.Module, spec):
        te = te_api.active().api.module
        layers = []
        for layer in model:
            module = te.LayerNormLinear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                        params_dtype=layer.weight.dtype)
            module.weight, module.bias = layer.weight, layer.bias
            layers.append(module)
        return torch.nn.Sequential(*layers)
