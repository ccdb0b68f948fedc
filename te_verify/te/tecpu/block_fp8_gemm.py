"""FP8 block scaling's GEMM on Hopper, accumulated as cuBLAS accumulates it.

cuBLAS's blockwise FP8 GEMM (sm90; TE converts block-scaled operands to MXFP8 on sm100) reads both operands with
their 128-wide scaling blocks along K and, per K tile, takes the FP8 values' product in fp32 (the tile's partial)
into the fp32 accumulator with one fused multiply-add that applies the scales: y = fma(partial * s1, s2, y), s1 the
1D-scaled operand's scale (when both are 1D, that of B, whose rows are the output's), s2 the other's; two 2D operands
(which TE refuses for GEMM, gemm_admission.py) would take fma(partial, s_B * s_A, y). In the epilogue an
accumulated output is rounded to the output dtype before C is added. This is the model TE's reference
(tests/pytorch/references/blockwise_fp8_gemm_reference.py) holds cuBLAS to bitwise in
test_float8_blockwise_gemm_exact.py;
dequantizing each operand first and multiplying once (gemm.product) rounds differently (1 element in 65,536 there).
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import block_fp8, block_quantize, block_scales, device
from te_verify.te.tecpu.reduction_order import fma

TILE = block_fp8.BLOCK  # cuBLAS's K tile is the scaling block, 128


def applies(A: Any, B: Any) -> bool:
    """Both operands FP8 block-scaled on a device whose cuBLAS runs the blockwise kernel (sm90)."""
    kinds = {block_quantize.kind_of(A), block_quantize.kind_of(B)}
    return kinds == {"Float8BlockQuantizer"} and device.sm_arch() < 100


def product(A: Any, transA: bool, B: Any, transB: bool) -> torch.Tensor:
    """op(B) @ op(A) in fp32, K tile by K tile (the module's docstring)."""
    x, sx, x_1d = _k_major(B, "B", use_rowwise=not transB)  # the output's rows: (M, K)
    w, sw, w_1d = _k_major(A, "A", use_rowwise=transA)  # its columns: (N, K)
    y = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    with torch.autocast(x.device.type, enabled=False):
        for tile in range(sx.shape[1]):
            k = slice(tile * TILE, (tile + 1) * TILE)
            partial = x[:, k] @ w[:, k].t()
            row_scale, col_scale = sx[:, tile, None], sw[None, :, tile]
            if x_1d:
                y = fma(partial * row_scale, col_scale.expand_as(y), y)
            elif w_1d:
                y = fma(partial * col_scale, row_scale.expand_as(y), y)
            else:
                y = fma(partial, (row_scale * col_scale).expand_as(y), y)
    return y


def _k_major(t: Any, name: str, use_rowwise: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The stored copy the GEMM reads (K its last dim, as cuBLAS's TN layout needs), its FP8 values in fp32, its
    scale_inv per row and K tile (a 2D block's scale on each of its 128 rows), and whether it is 1D-scaled."""
    block_quantize.check_usage(t, name, use_rowwise)
    data, scale_inv = block_quantize.block_fp8_copy(t, use_rowwise)
    scales = block_scales.expand(scale_inv.float(), TILE if t._is_2D_scaled else 1, 1)[:data.shape[0]]
    return data.view(device.torch_dtype(t._fp8_dtype)).float(), scales, not t._is_2D_scaled
