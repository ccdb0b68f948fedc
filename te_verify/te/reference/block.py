"""Block-scaled formats for the same-quantization reference, written here from the formats' definitions (not TE's
code, not the tex emulation's): each quantizes a 2-D tensor in blocks along its last dim and returns the exact
element values and, per element, the scale they are multiplied by (a block's scale repeated over its elements).

- MXFP8 (OCP Microscaling Formats v1.0, with TE's scale rule): one E8M0 scale 2^k per 1x32 block,
  k = ceil(log2(fp32(amax * fp32(1 / fp8_max)))), clamped to E8M0's range [-127, 127]; elements x / 2^k cast to
  E4M3/E5M2 (round to nearest even, saturating).
- FP8 block scaling (Float8BlockScaling): one fp32 scale per 1x128 block (or 128x128 tile for 2-D weights),
  scale = fp8_max / amax, 1 for an amax of 0, rounded down to a power of two (the recipe's default
  power_2_scale); elements x * scale cast to FP8; the operand is element / scale.
- NVFP4 (TE's NVFP4BlockScaling documentation): a per-tensor S_enc = 6 * 448 / amax (1 for an amax of 0) and an
  E4M3 scale s_b = e4m3(block_amax * S_enc / 6) per 1x16 block (16x16 tile for 2-D weights); elements
  e2m1(x / (s_b / S_enc)) (round to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating to 6); the operand is
  element * s_b * amax / (6 * 448). The random Hadamard transform (columnwise copies of inputs and gradients) is
  v @ (diag(signs) H16 / 4) per 16 consecutive elements, rounded to bf16, before quantization.
"""
from __future__ import annotations

import math

import torch

from te_verify.te.fp8 import FP8_MAX, quantize as fp8_cast

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX, E2M1_MAX = 448.0, 6.0
# The fixed sign vector of TE's random Hadamard transform (NVFP4BlockScaling's documented RHT for wgrad operands).
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def _tiles(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """max |x| per rows x cols tile (zero-padded at the edges), repeated back over the tile's elements."""
    m, k = x.shape
    pm, pk = math.ceil(m / rows) * rows, math.ceil(k / cols) * cols
    padded = torch.zeros(pm, pk, dtype=torch.float32, device=x.device)
    padded[:m, :k] = x.abs().float()
    amax = padded.reshape(pm // rows, rows, pk // cols, cols).amax(dim=(1, 3))
    return amax.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:m, :k]


def mxfp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(element values, per-element scale) of x in 1x32 MXFP8 blocks."""
    ratio = _tiles(x, 1, 32) * torch.tensor(1.0 / FP8_MAX[dtype], dtype=torch.float32)
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2^exponent, mantissa in [0.5, 1)
    k = torch.where(mantissa == 0.5, exponent - 1, exponent)  # the next power of two >= ratio
    k = torch.where(ratio == 0, -127, k).clamp(-127, 127).double()
    scale = torch.exp2(k).float()  # 2^-127 is an fp32 subnormal, exact
    values = fp8_cast(x.float() * torch.exp2(-k).float(), 1.0, dtype).float()
    return values, scale


def fp8_block(x: torch.Tensor, dtype: torch.dtype, two_d: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(element values, per-element scale_inv) of x in 1x128 blocks (128x128 tiles when two_d), pow2 scales."""
    amax = _tiles(x, 128 if two_d else 1, 128)
    scale = torch.tensor(FP8_MAX[dtype], dtype=torch.float32) / amax
    # An infinite scale becomes the input dtype's largest value (fp32's for the fp64 truth of an fp32 case).
    scale = torch.where(torch.isinf(scale), torch.finfo(x.dtype if x.dtype != torch.float64 else torch.float32).max,
                        scale)
    _, exponent = torch.frexp(scale)
    scale = torch.where(amax == 0, 1.0, torch.ldexp(torch.ones_like(scale), exponent - 1))  # rounded down to 2^k
    values = fp8_cast(x.float() * scale, 1.0, dtype).float()
    return values, torch.reciprocal(scale)


def _e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value, ties to the even code, saturating at 6; the sign kept."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=x.device)
    distance = (x.abs().clamp(max=E2M1_MAX).unsqueeze(-1) - grid).abs()
    nearest = distance == distance.min(-1, keepdim=True).values
    tie = nearest.sum(-1, keepdim=True) > 1
    even = torch.arange(8, device=x.device) % 2 == 0
    code = (nearest & (even | ~tie)).int().argmax(-1)  # of two equally near codes, the even one
    return grid[code] * torch.where(torch.signbit(x), -1.0, 1.0)


def nvfp4_scaled(x: torch.Tensor, amax: torch.Tensor, two_d: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x scaled onto the E2M1 range, its block's E4M3 scale s_b per element) of x in 1x16 NVFP4 blocks (16x16 tiles
    when two_d), under the per-tensor amax `amax`: what an element's E2M1 value is rounded from, and its block scale."""
    amax = amax.float()
    fp32_max = torch.finfo(torch.float32).max
    s_enc = torch.clamp(torch.tensor(E4M3_MAX * E2M1_MAX) / amax, max=fp32_max)
    s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    block = _tiles(x, 16 if two_d else 1, 16)
    s_b = torch.clamp(block * (s_enc * torch.tensor(1.0 / E2M1_MAX)), max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    encode = torch.clamp(torch.reciprocal(s_b * torch.reciprocal(s_enc)), max=fp32_max)
    return x.float() * encode, s_b


def e2m1_neighbours(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper): the E2M1 magnitudes enclosing |v| (equal where |v| is on the grid; 6 from 6 up and for NaN,
    saturating)."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=v.device)
    a = v.abs().float().nan_to_num(nan=E2M1_MAX).clamp(max=E2M1_MAX).unsqueeze(-1)
    upper = grid[(a > grid).sum(-1)]  # the first grid value >= a (comparisons: torch.bucketize is ~100x slower on CPU)
    lower = grid[(a >= grid).sum(-1) - 1]  # the last grid value <= a
    return lower, upper


def nvfp4(x: torch.Tensor, amax: torch.Tensor, two_d: bool,
          up: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(element values, per-element scale) of x in 1x16 NVFP4 blocks (16x16 tiles when two_d), under the
    per-tensor amax `amax`: rounded to nearest, or stochastically by `up` (per element, True: to the upper E2M1
    neighbour of the scaled value, False: to the lower one)."""
    scaled, s_b = nvfp4_scaled(x, amax, two_d)
    scale = s_b * (amax.float() * torch.tensor(1.0 / (E2M1_MAX * E4M3_MAX)))
    if up is None:
        return _e2m1(scaled), scale
    lower, upper = e2m1_neighbours(scaled)
    return torch.where(up, upper, lower) * torch.where(torch.signbit(scaled), -1.0, 1.0), scale


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """The random Hadamard transform of each run of 16 along the last dim, rounded to bf16."""
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)  # Sylvester's construction
    matrix = (torch.diag(torch.tensor(RHT_SIGNS, dtype=torch.float32)) @ h / 4).to(torch.bfloat16).float()
    return (x.float().reshape(-1, 16) @ matrix).reshape(x.shape).to(torch.bfloat16)
