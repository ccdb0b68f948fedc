"""FP8 block scaling (Float8BlockScaling, DeepSeek-style): E4M3/E5M2 elements, one fp32 scale per block of 1x128
(activations and gradients; "1D") or 128x128 (weights; "2D") elements.

Per block (TE 2.20.2, common/recipe/recipe_common.cuh compute_scale_from_types, called by the block-scaling cast
kernels, e.g. common/cast/fp8_blockwise/group_quantize_fp8_blockwise.cuh):
- amax = max |x| (fmaxf from 0: NaN elements skipped);
- amax < amax_epsilon -> amax_epsilon; amax 0, inf or NaN -> scale 1;
- scale = fp8_max / amax (fp32, round to nearest); an infinite scale -> the INPUT dtype's largest finite value
  (TypeInfo<IType>::max_finite_value); power_2: the scale's mantissa bits cleared (rounded down to 2^k);
- scale_inv = 1 / scale (fp32), elements = static_cast<fp8>(x * scale): round to nearest even, saturating.
A block past the tensor's edge covers only the elements inside it. 1D columnwise data is the transposed tensor
quantized in 1x128 blocks (128x1 blocks of the original); 2D columnwise data is the rowwise data transposed (one
scale per tile, so the bytes are the same).
"""
from __future__ import annotations

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_scales

BLOCK = 128
EXPONENT_MASK = int(0xFF800000 - (1 << 32))  # sign and exponent bits of an fp32, as an int32


def scale_from_amax(amax: torch.Tensor, fp8_max: float, pow2: bool, epsilon: float,
                    value_for_inf: float) -> torch.Tensor:
    """compute_scale_from_amax, elementwise over an fp32 tensor of block amaxes."""
    amax = amax.float()
    floored = torch.where(amax < epsilon, torch.tensor(epsilon, dtype=torch.float32), amax)
    scale = torch.tensor(fp8_max, dtype=torch.float32) / floored
    scale = torch.where(torch.isinf(scale), torch.tensor(value_for_inf, dtype=torch.float32), scale)
    if pow2:
        scale = (scale.view(torch.int32) & EXPONENT_MASK).view(torch.float32)
    one = torch.isinf(floored) | (floored == 0) | torch.isnan(floored)
    return torch.where(one, torch.tensor(1.0, dtype=torch.float32), scale)


def _padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return block_scales.padded(x, block_scales.round_up(x.shape[0], rows), block_scales.round_up(x.shape[1], cols))


def quantize(x: torch.Tensor, dtype: torch.dtype, two_d: bool, pow2: bool,
             epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D tensor as (FP8 bytes, same shape; compact fp32 scale_inv: (M, ceil(K/128)) for 1x128 blocks,
    (ceil(M/128), ceil(K/128)) for 128x128)."""
    rows, cols = (BLOCK, BLOCK) if two_d else (1, BLOCK)
    xf = x.float()
    amax = block_scales.block_amax(_padded(xf, rows, cols), rows, cols)  # zero padding never raises an amax
    scale = scale_from_amax(amax, fp8.FP8_MAX[dtype], pow2, epsilon, torch.finfo(x.dtype).max)
    per_element = block_scales.expand(scale, rows, cols)[:x.shape[0], :x.shape[1]]
    data = fp8.quantize(xf, per_element, dtype).view(torch.uint8)
    return data, torch.reciprocal(scale)


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype, two_d: bool) -> torch.Tensor:
    """fp32 values of FP8 bytes (M, K) with their compact scale_inv."""
    rows, cols = (BLOCK, BLOCK) if two_d else (1, BLOCK)
    per_element = block_scales.expand(scale_inv.float(), rows, cols)[:data.shape[0], :data.shape[1]]
    return data.view(dtype).float() * per_element
