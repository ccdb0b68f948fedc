"""Planted TE-lane backends for tests of the lane itself.

`RouterLinearTE` runs each layer as TE's Linear followed by TE's fused MoE router
(`transformer_engine.pytorch.router.fused_topk_with_score_function`), which reaches
tex.fused_topk_with_score_function_fwd: a tex function the emulation does not emulate (tex.layernorm_fwd, tex.gelu,
tex.situglu, tex.scaled_srelu, tex.scaled_softmax_forward and tex.fused_rope_forward, this backend's functions
before, are emulated since; te/tecpu/norm.py, activation.py, scaled_activation.py, attention.py, rope.py). Its cases
must error naming the function and TE's call site, never pass.
"""
from __future__ import annotations

import importlib

import torch

from te_verify.te import api as te_api

ROUTER = "transformer_engine.pytorch.router"


class _FusedRouter(torch.nn.Module):
    """TE's fused top-k router over the layer's output, its last dim as the experts' logits: the routed (softmax)
    probabilities, 0 off the top 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x.reshape(-1, x.shape[-1])
        probs, _ = importlib.import_module(ROUTER).fused_topk_with_score_function(
            logits, topk=2, use_pre_softmax=False, num_groups=None, group_topk=None, scaling_factor=None,
            score_function="softmax", expert_bias=None)
        return probs.reshape(x.shape)


class RouterLinearTE:
    """TE's Linear over the model's Linear weights, then TE's fused MoE router (the part the emulation lacks)."""

    name = "te_router_linear"
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
            layers += [module, _FusedRouter()]
        return torch.nn.Sequential(*layers)
