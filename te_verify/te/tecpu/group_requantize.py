"""tex.grouped_swizzle_for_gemm and tex.group_requantize_inplace (TE >= 2.19; csrc/extensions/swizzle.cpp and
cast.cpp of the 2.20.2 sdist): a grouped MXFP8 tensor made GEMM-ready, as te.ops' GroupedLinear does with an input
or grad that arrives already rowwise-quantized (FP8 token dispatch).

grouped_swizzle_for_gemm: each group's compact MXFP8 scales (those of its data: the padding around them is written as
zeros, whatever it held) rewritten over its padded region of the grouped buffer in cuBLAS's swizzled layout
(block_scales.store; a columnwise region swizzled as its transpose, as TE's per-tensor swizzle does) into a new buffer: the input's shape when a dimension varies, (num_tensors * padded rows, padded
blocks) when every group has one shape. Any other format, or scales already swizzled, is left alone; the direction
not asked for loses its scales (the binding sets them to None), as in TE.

group_requantize_inplace: TE's checks, then its unfused chain: the groups dequantized (group_dequantize), the rowwise
scales swizzled and flattened, and, when the quantizer's columnwise usage says a wgrad GEMM reads one, the
columnwise copy quantized per group from the dequantized values (group_quantize; swizzled, as the op's quantizer
optimizes for GEMM). TE's fused kernel (sm >= 100, BF16, E4M3, offsets at hand) computes the same values by TE's own
account ("reproduces the unfused chain's numerics"; TE's test_prequantized_requantize_versus_reference holds it to
the chain's reference bitwise) and differs in one effect kept here: it leaves the caller's quantizer's usage as it
was, where the chain switches its rowwise usage off.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from te_verify.te.tecpu import block_quantize, block_scales, device, group_quantize
from te_verify.te.tecpu.te_classes import te_class

FUSED_ENV = "NVTE_FUSED_GROUP_REQUANTIZE"
MXFP8_BLOCK = 32


def _empty(scales: torch.Tensor | None) -> bool:
    """swizzle.cpp's is_empty_grouped_tensor_param: no buffer, or a 1-D one of no element."""
    return scales is None or (scales.dim() == 1 and scales.numel() == 0)


def _uniform_shape(tensor: Any, columnwise: bool) -> tuple[int, int]:
    """The swizzled buffer's 2-D shape when every group has one shape: one padded (rows, blocks) region a group."""
    first, last = tensor.logical_shape[0] // tensor.num_tensors, tensor.logical_shape[-1]
    m, k = (last, first) if columnwise else (first, last)
    return (tensor.num_tensors * block_scales.round_up(m, block_scales.TILE_ROWS),
            block_scales.round_up(-(-k // MXFP8_BLOCK), block_scales.TILE_COLS))


def _swizzled(tensor: Any, buffer: torch.Tensor, views: list, columnwise: bool) -> torch.Tensor:
    """A new buffer holding each group's scales swizzled over its padded region, the padding zeroed (TE's kernel reads
    only the scales of the group's data and writes zeros around them)."""
    out = buffer.clone()
    flat = out.reshape(-1)
    for view in views:
        region = view._columnwise_scale_inv if columnwise else view._rowwise_scale_inv
        if region is None or region.numel() == 0:
            continue
        data = view._columnwise_data if columnwise else view._rowwise_data
        rows, cols = block_quantize.compact_scale_dims("MXFP8Quantizer", tuple(data.shape), columnwise)
        start = region.storage_offset() - buffer.storage_offset()
        block_scales.store(flat[start:start + region.numel()].view(region.shape), region[:rows, :cols].clone(),
                           swizzled=True, transposed=columnwise)
    variable = tensor.first_dims is not None or tensor.last_dims is not None
    return out if variable else out.view(_uniform_shape(tensor, columnwise))


def grouped_swizzle_for_gemm(tensor: Any, rowwise: bool, columnwise: bool) -> None:
    """A grouped MXFP8 tensor's compact scales, the directions asked for, swizzled for the grouped GEMM."""
    if not isinstance(tensor.quantizer, te_class("MXFP8Quantizer")) or tensor._with_gemm_swizzled_scales:
        return
    swizzle_rows = rowwise and not _empty(tensor.scale_inv)
    swizzle_cols = columnwise and not _empty(tensor.columnwise_scale_inv)
    if not (swizzle_rows or swizzle_cols):
        return
    views = group_quantize.group_views(tensor)
    rows = _swizzled(tensor, tensor.scale_inv, views, False) if swizzle_rows else None
    cols = _swizzled(tensor, tensor.columnwise_scale_inv, views, True) if swizzle_cols else None
    tensor.scale_inv, tensor.columnwise_scale_inv = rows, cols
    tensor._with_gemm_swizzled_scales = True


def _fused_kernel_enabled() -> bool:
    """transformer_engine::getenv<bool>(NVTE_FUSED_GROUP_REQUANTIZE, true): unset or empty is the default."""
    value = os.environ.get(FUSED_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise RuntimeError("Invalid environment variable value")
    return value != "0"


def _check_formats(grouped_x: Any, quantizer: Any, need_columnwise: bool, return_dequantized: bool) -> bool:
    """cast.cpp's checks before any kernel runs. Returns whether the input is already GEMM-ready (nothing to do)."""
    if grouped_x.rowwise_data is None or grouped_x.scale_inv is None:
        raise RuntimeError("Grouped input has no rowwise data and scales for the GEMM to consume.")
    if grouped_x.quantizer is None:
        raise RuntimeError("Grouped input has no quantizer.")
    if type(grouped_x.quantizer) is not type(quantizer):
        raise RuntimeError("Grouped input and the op disagree on quantization format.")
    if grouped_x.quantizer.dtype != quantizer.dtype:
        raise RuntimeError("Grouped input and the quantizer disagree on the FP8 dtype.")
    has_columnwise = grouped_x.columnwise_data is not None and grouped_x.columnwise_scale_inv is not None
    if grouped_x._with_gemm_swizzled_scales:
        if need_columnwise and not has_columnwise:
            raise RuntimeError("Grouped input has swizzled scales but no columnwise data for the wgrad GEMM. It "
                               "cannot be rebuilt, because dequantization requires scales in compact format.")
        if return_dequantized:
            raise RuntimeError("Cannot return a dequantized tensor for an already-swizzled grouped input: "
                               "dequantization requires scales in compact format.")
        return True
    if has_columnwise:
        raise RuntimeError("Grouped input already has columnwise data but unswizzled scales; requantizing from it "
                           "is not supported.")
    if not isinstance(quantizer, te_class("MXFP8Quantizer")):
        raise RuntimeError("Requantizing a grouped input is only supported for MXFP8.")
    return False


def _takes_fused_kernel(num_tensors: int, first_dims: torch.Tensor | None, tensor_offsets: torch.Tensor | None,
                        total_tokens: int, otype: Any, quantizer: Any) -> bool:
    offsets_usable = (tensor_offsets is not None and tensor_offsets.dtype == torch.int64
                      and tensor_offsets.numel() == num_tensors + 1)
    return (_fused_kernel_enabled() and (offsets_usable or first_dims is not None) and total_tokens > 0
            and device.torch_dtype(otype) == torch.bfloat16
            and device.torch_dtype(quantizer.dtype) == torch.float8_e4m3fn and device.sm_arch() >= 100)


def group_requantize_inplace(grouped_x: Any, quantizer: Any, num_tensors: int, first_dims: torch.Tensor | None,
                             otype: Any, tensor_offsets: torch.Tensor | None = None,
                             return_dequantized: bool = False) -> torch.Tensor | None:
    """A rowwise-prequantized grouped MXFP8 tensor made GEMM-ready in place; the dequantized values if asked."""
    need_columnwise = bool(quantizer.columnwise_usage)
    if _check_formats(grouped_x, quantizer, need_columnwise, return_dequantized):
        return None
    tokens, hidden = grouped_x.logical_shape[0], grouped_x.logical_shape[1]
    if tokens % 128 or hidden % 128:
        raise RuntimeError(f"Requantizing a grouped input requires dims that are multiples of 128, but got "
                           f"({tokens}, {hidden}).")
    fused = need_columnwise and _takes_fused_kernel(num_tensors, first_dims, tensor_offsets, tokens, otype, quantizer)
    dequantized = None
    if need_columnwise or return_dequantized:
        dequantized = group_quantize.group_dequantize(grouped_x, otype).rowwise_data.view(tokens, hidden)
    grouped_swizzle_for_gemm(grouped_x, True, False)
    grouped_x.scale_inv = grouped_x.scale_inv.reshape(-1)
    if need_columnwise:
        columnwise_quantizer = quantizer.copy() if fused else quantizer
        columnwise_quantizer.set_usage(rowwise=False, columnwise=True)
        columnwise = group_quantize.group_quantize(dequantized, columnwise_quantizer, num_tensors, first_dims,
                                                   None, tensor_offsets)
        grouped_x.columnwise_data = columnwise.columnwise_data
        grouped_x.columnwise_scale_inv = columnwise.columnwise_scale_inv
    return dequantized if return_dequantized else None


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"grouped_swizzle_for_gemm": grouped_swizzle_for_gemm,
            "group_requantize_inplace": group_requantize_inplace}
