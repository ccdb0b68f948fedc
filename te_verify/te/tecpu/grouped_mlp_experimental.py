"""tex.grouped_mlp_experimental (csrc/extensions/grouped_mlp_experimental.cpp, 2.20.2 sdist): the fused grouped
MLP's helper for discrete (per-expert) weights. Each weight's scales (one padded shape and one data shape for all,
tensor 0's) are swizzled for the GEMM (block_scales.store: the scales of the data, the padding around them written as
zeros whatever it held, as TE's kernel does; MXFP8's columnwise scales as their transpose) into one new buffer at a
uniform stride of the scales' bytes rounded up to 16, and the weights' data pointers and the swizzled scales'
pointers are packed as int64, two views of one buffer. The emulated device is the CPU, so the
pointers are CPU addresses; the cuDNN kernels that would read them are not emulated (TE's fused grouped MLP reports
itself unsupported here)."""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import block_quantize, block_scales, device

SWIZZLE_TYPES = ("mxfp8_rowwise", "mxfp8_columnwise", "nvfp4")
POINTER_ALIGNMENT = 16


def swizzle_scales_and_pack_ptrs_for_discrete_weights(data_tensors: list[torch.Tensor],
                                                      scale_tensors: list[torch.Tensor], swizzle_type: str,
                                                      device_: Any) -> tuple[torch.Tensor, torch.Tensor,
                                                                             torch.Tensor]:
    """(data pointers, swizzled scale pointers, the swizzled scales' buffer) of the per-expert weights."""
    num = len(data_tensors)
    if len(scale_tensors) != num:
        raise RuntimeError(f"Expected data_tensors and scale_tensors to have matching sizes, but got {num} and "
                           f"{len(scale_tensors)}.")
    if swizzle_type not in SWIZZLE_TYPES:
        raise RuntimeError(f"Unsupported swizzle type ({swizzle_type}). Expected one of: mxfp8_rowwise, "
                           "mxfp8_columnwise, nvfp4.")
    if num == 0:
        pointers = torch.empty(0, dtype=torch.int64, device=device.EMULATED)
        return pointers, pointers.clone(), torch.empty(0, dtype=torch.uint8, device=device.EMULATED)
    shape = tuple(scale_tensors[0].shape)
    if len(shape) != 2:
        raise RuntimeError(f"Expected 2D scale tensor, but got shape={list(shape)}.")
    stride = block_scales.round_up(shape[0] * shape[1], POINTER_ALIGNMENT)
    buffer = torch.zeros(stride * num, dtype=torch.uint8, device=device.EMULATED)
    columnwise = swizzle_type == "mxfp8_columnwise"
    kind = "NVFP4Quantizer" if swizzle_type == "nvfp4" else "MXFP8Quantizer"
    rows, cols = block_quantize.compact_scale_dims(kind, tuple(data_tensors[0].shape), columnwise)
    for i, scales in enumerate(scale_tensors):
        compact = scales.view(torch.uint8).reshape(shape)[:rows, :cols].clone()
        block_scales.store(buffer[i * stride:i * stride + shape[0] * shape[1]].view(shape), compact, swizzled=True,
                           transposed=columnwise)
    pointers = torch.tensor([t.data_ptr() for t in data_tensors] + [buffer.data_ptr() + i * stride
                                                                     for i in range(num)], dtype=torch.int64)
    return pointers[:num], pointers[num:], buffer


def functions() -> dict[str, Any]:
    """The emulated functions of tex.grouped_mlp_experimental, by name."""
    return {"swizzle_scales_and_pack_ptrs_for_discrete_weights": swizzle_scales_and_pack_ptrs_for_discrete_weights}
