"""Planted TE-lane backends for tests of the lane itself.

`RoPELinearTE` runs each layer as TE's Linear followed by TE's fused rotary position embedding
(`apply_rotary_pos_emb(..., fused=True)`), which reaches tex.fused_rope_forward: a tex function the emulation does
not emulate (tex.layernorm_fwd, tex.gelu, tex.situglu, tex.scaled_srelu and tex.scaled_softmax_forward, this
backend's functions before, are emulated since; te/tecpu/norm.py, activation.py, scaled_activation.py,
attention.py). Its cases must error naming the function and TE's call site, never pass.
"""
from __future__ import annotations

import importlib

import torch

from te_verify.te import api as te_api

ROPE = "transformer_engine.pytorch.attention.rope"


class _FusedRoPE(torch.nn.Module):
    """TE's fused RoPE over the layer's output, its rows as positions (zero frequencies: the identity)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(x.shape[0], 1, 1, -1)
        freqs = torch.zeros(x.shape[0], 1, 1, rows.shape[-1])
        return importlib.import_module(ROPE).apply_rotary_pos_emb(rows, freqs, fused=True).reshape(x.shape)


class RoPELinearTE:
    """TE's Linear over the model's Linear weights, then TE's fused RoPE (the part the emulation lacks)."""

    name = "te_rope_linear"
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
            layers += [module, _FusedRoPE()]
        return torch.nn.Sequential(*layers)
