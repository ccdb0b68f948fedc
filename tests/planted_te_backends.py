"""Planted TE-lane backends for tests of the lane itself.

`UserbuffersLinearTE` runs each layer as TE's Linear after setting up TE's comm+GEMM overlap
(`transformer_engine.pytorch.initialize_ub`, Userbuffers), which reaches tex.device_supports_multicast: a tex function
the emulation does not emulate (tex.layernorm_fwd, tex.gelu, tex.situglu, tex.scaled_srelu, tex.scaled_softmax_forward,
tex.fused_rope_forward and tex.fused_topk_with_score_function_fwd, this backend's functions before, are emulated since;
te/tecpu/norm.py, activation.py, scaled_activation.py, attention.py, rope.py, fused_router.py). Its cases must error
naming the function and TE's call site, never pass.
"""
from __future__ import annotations

import torch

from te_verify.te import api as te_api


class UserbuffersLinearTE:
    """TE's Linear over the model's Linear weights, after TE's Userbuffers setup (the part the emulation lacks)."""

    name = "te_userbuffers_linear"
    lane = "te"

    def available(self) -> tuple[bool, str]:
        return te_api.active().runs_te_python, "needs TE's Python"

    def prepare(self, model, spec):
        te = te_api.active().api.module
        te.initialize_ub([16, max(layer.out_features for layer in model)], 1)  # [tokens, hidden], tp_size 1
        layers = []
        for layer in model:
            module = te.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                               params_dtype=layer.weight.dtype)
            module.weight, module.bias = layer.weight, layer.bias
            layers.append(module)
        return torch.nn.Sequential(*layers)
