"""A tex activation's output: its fp32 values written as activation.cpp (activation_helper, dactivation_helper) and
bias.cpp (dact_dbias) write them for the quantizer given, TE main d0067d0 (the newest C++ at hand for TE 2.20.2's
Python; the wheel ships none):

- none: the values in the output dtype;
- Float8Quantizer ("FULLY_FUSED"): FP8 cast straight from the fp32 values, amax over them;
- MXFP8Quantizer ("FULLY_FUSED"): the MXFP8 kernels (cast/mxfp8/quantize_mxfp8.cuh, gated_mxfp8.cuh) round each
  value to the kernel's input dtype ("numerical truncation") before the block amax and the cast, so the bytes are
  those of quantizing the values in the output dtype;
- Float8CurrentScalingQuantizer ("FUSED_ACTIVATION_AMAX_FP8") and NVFP4Quantizer ("FUSED_ACTIVATION_AMAX_NVFP4"):
  the kernel writes the values in the output dtype and their amax over the fp32 values (util/vectorized_pointwise.h,
  cast/fp8/gated_fp8.cuh: fmaxf(|v|) before the cast); quantize_with_amax casts the rounded values under that amax;
- Float8BlockQuantizer, row-scaled NVFP4, NVFP4 with the RHT and post-RHT amax ("UNFUSED"): the values in the output
  dtype, quantized by the quantizer's own quantize.
A fused bias gradient (dact_dbias) sums the fp32 values on the FULLY_FUSED paths (the kernels' partial sums), else
the values in the output dtype (at::sum_out over the temporary). Any other quantizer is refused, naming it.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import quantize
from te_verify.te.tecpu.block_scales import tensor_amax
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class

FULLY_FUSED = ("Float8Quantizer", "MXFP8Quantizer")
KINDS = (*FULLY_FUSED, "Float8CurrentScalingQuantizer", "NVFP4Quantizer", "Float8BlockQuantizer")


def kind_of(quantizer: Any) -> str | None:
    """The quantizer's class name among those emulated here (None for no quantizer); any other is refused."""
    if quantizer is None:
        return None
    found = next((k for k in KINDS if isinstance(quantizer, te_class(k))), None)
    if found is None:
        refuse(f"an activation quantizing its output with {type(quantizer).__name__}")
    return found


def _amax_fused(kind: str | None, quantizer: Any) -> bool:
    """activation.cpp's FUSED_ACTIVATION_AMAX_* choice (NVFP4 leaves row-scaled and RHT amaxes to its quantizer)."""
    if kind == "Float8CurrentScalingQuantizer":
        return True
    return kind == "NVFP4Quantizer" and not (quantizer.row_scaled_nvfp4 or
                                             (quantizer.with_rht and quantizer.with_post_rht_amax))


def sums_fp32(quantizer: Any) -> bool:
    """Whether dact_dbias's bias gradient sums the fp32 values (its fully fused kernels) or the rounded ones."""
    return kind_of(quantizer) in FULLY_FUSED


def write(values: torch.Tensor, quantizer: Any, dtype: torch.dtype) -> Any:
    """The kernel's fp32 `values` as TE's Python receives them: in `dtype`, or quantized by `quantizer`."""
    kind = kind_of(quantizer)
    if kind == "Float8Quantizer":
        out = quantize.create_empty_quantized_tensor(quantizer, list(values.shape), dtype, values.device, False)
        return quantize.quantize(values, quantizer, out)
    rounded = values.to(dtype)
    if kind is None:
        return rounded
    if _amax_fused(kind, quantizer):
        return quantize.quantize_with_amax(rounded, quantizer, tensor_amax(values))
    return quantize.quantize(rounded, quantizer)
