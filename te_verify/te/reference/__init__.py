"""te_verify.te.reference: a pure-PyTorch model of TE's semantics serving the TE API subset the cases use.

FP8 is emulated per tensor (quantize with torch's float8 dtypes, GEMM in fp32 on dequantized operands);
the work done is exactly what the intended contract requires, and every GEMM is logged (gemm_log.py).
"""
from __future__ import annotations

from te_verify.te.reference.autocast import autocast, fp8_autocast, get_fp8_recipe, is_fp8_enabled
from te_verify.te.reference.grouped import GroupedLinear
from te_verify.te.reference.grouped_mlp import GroupedMLP
from te_verify.te.reference.linear import Linear
from te_verify.te.reference.recipe import DelayedScaling, Float8CurrentScaling, Format
from te_verify.te.reference.wgrad import get_dummy_wgrad


def is_fp8_available(return_reason: bool = False):
    """FP8 is always available on the reference (emulated on CPU)."""
    return (True, "") if return_reason else True


__all__ = ["Linear", "GroupedLinear", "GroupedMLP", "autocast", "fp8_autocast", "DelayedScaling",
           "Float8CurrentScaling", "Format", "is_fp8_available", "is_fp8_enabled", "get_fp8_recipe",
           "get_dummy_wgrad"]
