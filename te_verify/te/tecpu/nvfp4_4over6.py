"""NVFP4 4over6 ("Four Over Six"): per 16-element block, two candidate encodings; the one with the lower error is kept.

TE 2.20.2's Python selects it (NVFP4Quantizer's nvfp4_use_4over6, nvfp4_e4m3_max, nvfp4_4over6_err_mode); its C++ is
not in the wheel, so the definition here is TE main's kernel (d0067d0, common/cast/nvfp4/quantize_4over6_nvfp4.cuh:
compute_scale_pair, cvt_fp32_to_fp4_8x_with_error, accumulate_dequant_error, accumulate_fp16_scaled_error_pair,
quantize_stage_rowwise / _colwise), which cast/dispatch/quantize.cuh runs for every 4over6 quantizer. In fp32, with E
the quantizer's nvfp4_e4m3_max (448, or 256 to leave the map-to-4 scale room):
- S_enc = E * 6 / amax (nvfp4.global_encode_scale), amax the tensor's (the row's, row-scaled);
- base = block_amax / 6 * S_enc (divided, where the plain cast multiplies by fp32(1/6)); the map-to-6 scale
  s6 = e4m3(min(base, 448)) and the map-to-4 scale s4 = e4m3(min(base * 1.5, 448)) (448 whatever E is);
- each candidate's elements: q = e2m1(x * min(1 / (s * (1 / S_enc)), fp32 max)), nearest even, saturating;
- its error, added over the block's 16 elements in order: |d| (MAE) or d * d (MSE) of
  d = ((q * s) * amax) / (6 * E) - x, or, with NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1, d = q * s - x * S_enc (the
  kernel's fp16 product q * s is exact: at most 6 significant bits and at most 2688);
- map-to-4 wins only when its error is strictly lower (a tie, or NaN, keeps map-to-6).
2D (16x16 tiles): the tile's amax for every row's block, the 16 rows' errors summed as the warp's shuffle tree does
(row i plus row i + 8, then plus the sum 4 rows on, 2, 1), one choice per tile. The columnwise copy is x^T quantized
the same way (the kernel's column pass reads each column's 16 elements in row order and sums 2D errors across 16
columns).
"""
from __future__ import annotations

import os

import torch

from te_verify.te.tecpu import block_scales
from te_verify.te.tecpu.nvfp4 import (BLOCK, E2M1_MAX, E4M3_MAX, FP32_MAX, decode, encode_nearest, global_encode_scale,
                                      pack)

EXPAND_TO_MAP4 = 1.5
FAST_MATH_ENV = "NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH"


def err_use_fast_math() -> bool:
    """transformer_engine::getenv<bool>, read at each quantization as quantize_impl does: unset or empty is false,
    otherwise the value must parse as a stream bool ("0" or "1")."""
    value = os.environ.get(FAST_MATH_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise RuntimeError("Invalid environment variable value")
    return value == "1"


def _candidate(xf: torch.Tensor, scale: torch.Tensor, s_dec: torch.Tensor,
               rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(E2M1 codes, their fp32 values) of x under one candidate's E4M3 block scales."""
    inverse = torch.minimum(torch.reciprocal(scale.float() * s_dec), torch.tensor(FP32_MAX))
    codes = encode_nearest(xf * block_scales.expand(inverse, rows, BLOCK))
    return codes, decode(codes)


def _block_error(d: torch.Tensor, mse: bool) -> torch.Tensor:
    """(M, K/16): each 1x16 block's |d| or d * d added element by element in order, in fp32, as the kernel's loop."""
    e = (d * d if mse else d.abs()).reshape(d.shape[0], -1, BLOCK)
    total = torch.zeros(e.shape[:2], dtype=torch.float32, device=d.device)
    for i in range(BLOCK):
        total = total + e[..., i]
    return total


def _tile_error(err: torch.Tensor) -> torch.Tensor:
    """(M/16, K/16): 16 rows' block errors summed in reduce_group_sum_16's shuffle-tree order."""
    r = err.reshape(err.shape[0] // BLOCK, BLOCK, err.shape[1])
    for half in (8, 4, 2, 1):
        r = r[:, :half] + r[:, half:2 * half]
    return r[:, 0]


def quantize(x: torch.Tensor, amax: torch.Tensor, e4m3_max: int, err_mode: str, fast_math: bool,
             two_d: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D tensor (dims divisible by 16) as (packed E2M1 (M, K/2); compact E4M3 scale bytes (M, K/16)), each block
    (1x16, or 16x16 tile when two_d) the 4over6 choice under `amax` ((1,), or (M,) row-scaled) and err_mode
    ("MAE" or "MSE")."""
    xf = x.float()
    rows = BLOCK if two_d else 1
    s_enc = global_encode_scale(amax, e4m3_max)  # (1, 1) or one per row (M, 1)
    s_dec = torch.reciprocal(s_enc)
    base = block_scales.block_amax(xf, rows, BLOCK) / E2M1_MAX * s_enc
    s4 = torch.minimum(base * EXPAND_TO_MAP4, torch.tensor(E4M3_MAX)).to(torch.float8_e4m3fn)
    s6 = torch.minimum(base, torch.tensor(E4M3_MAX)).to(torch.float8_e4m3fn)
    errors, codes = [], []
    for scale in (s4, s6):
        candidate_codes, values = _candidate(xf, scale, s_dec, rows)
        product = values * block_scales.expand(scale.float(), rows, BLOCK)  # q * s, exact
        if fast_math:
            d = product - xf * s_enc
        else:
            d = product * amax.float().reshape(-1, 1) / torch.tensor(E2M1_MAX * e4m3_max, dtype=torch.float32) - xf
        err = _block_error(d, err_mode == "MSE")
        errors.append(_tile_error(err) if two_d else err)
        codes.append(candidate_codes)
    pick4 = errors[0] < errors[1]
    chosen = torch.where(block_scales.expand(pick4, rows, BLOCK), codes[0], codes[1])
    scales = torch.where(pick4, s4.view(torch.uint8), s6.view(torch.uint8))
    return pack(chosen), scales.repeat_interleave(rows, 0)
