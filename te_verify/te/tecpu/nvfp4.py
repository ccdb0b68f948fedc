"""NVFP4: E2M1 elements (two per byte), an E4M3 scale per 16 elements and an fp32 per-tensor scale.

Two-level scaling as TE documents it (NVFP4BlockScaling; custom_recipes/reference_nvfp4.py) and TE 2.20.2's kernels
compute it in fp32 (common/cast/nvfp4/core_nvfp4.cuh, quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh):
- per tensor: S_enc = 448 * 6 / amax (capped at fp32's max; 1 when amax is 0 or the quotient is 0), S_dec = 1/S_enc;
- per block: s_b = e4m3(min(block_amax * (S_enc * fp32(1/6)), fp32 max)), saturating to 448 (stored as E4M3 bits);
- elements: q = e2m1(x * min(1 / (s_b * S_dec), fp32 max)), round to nearest even on the E2M1 grid
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating to 6 (ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
  5 -> 4); the sign kept (codes 8-15 are the negatives, -0 is 8); NaN -> +6, as TE's software fallback of the
  saturating cvt has it (common/util/ptx.cuh stochastic_round_fp4_e2m1);
- stochastic rounding (gradients): TE's stochastic_round_fp4_e2m1 with 8 random bits u per element:
  t = |x| + (u / 256) * step(|x|), q = min(floor(t / step(t)) * step(t), 6), the sign of x (step 0.5 below 2, 1 in
  [2, 4), 2 from 4);
- packing: element 2i in the low nibble, 2i+1 in the high nibble (reference_nvfp4.cast_to_fp4x2);
- dequantization: q * (float(s_b) * amax * fp32(1 / (6 * E))) (dequantize_nvfp4.cuh), E the storage's
  nvfp4_e4m3_max (448; 256 only for 4over6 tensors, nvfp4_4over6.py).
Row-scaled NVFP4 (NVFP4BlockScaling(row_scaled_activation=True)): `amax` holds one value per row of the quantized
matrix (TE main's compute_rowwise_amax_kernel; columnwise, one per column of x, compute_columnwise_amax_kernel) and
each row has its own S_enc from it (quantize_transpose_nvfp4_tuned_1D.cuh, ROW_SCALED_NVFP4); dequantization reads
amax[row]. cuBLAS takes no row-scaled operand: TE's Python (cpp_extensions/gemm.py) runs the GEMM on aliases whose
amax is 1 and multiplies the fp32 output by the row and column amaxes itself.
1D blocks are 1x16 along the last dim; the columnwise copy is the transposed tensor quantized the same way (16x1
blocks of the original). 2D quantization (weights): one block amax per 16x16 tile, stored per 1x16 block of each
direction. The random Hadamard transform (RHT) applies to the columnwise copy only: each run of 16 consecutive
elements of a row of x^T becomes v @ (diag(signs) @ H16 / 4) (the quantizer's bf16 rht_matrix), computed in fp32
and rounded to bf16 (the kernels' intermediate), and the columnwise amax is taken after it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from te_verify.te.tecpu import block_scales

BLOCK = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0
FP32_MAX = torch.finfo(torch.float32).max
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes, by code
RCP_6 = torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32)  # fp4_max_inv, an fp32 constant


def _fp32_reciprocal(product: float) -> torch.Tensor:
    """1.0f / product in fp32, as the kernels' constexpr factors are (the products are exact in fp32)."""
    return torch.tensor(1.0) / torch.tensor(product, dtype=torch.float32)


def dequantize_factor(e4m3_max: int) -> torch.Tensor:
    """dequantize_nvfp4.cuh's factor_inv: 1.0f / (6 * E4M3_MAX)."""
    return _fp32_reciprocal(E2M1_MAX * e4m3_max)


class GlobalScale(NamedTuple):
    """An NVFP4 GEMM operand's per-tensor scale: its amax (0-D fp32) and its storage's nvfp4_e4m3_max."""
    amax: torch.Tensor
    e4m3_max: int


# The encoders look codes up instead of comparing each element with the grid (that took 80% of a stochastic-rounding
# quantization, TE's 8192 x 8192 test items): every grid value and midpoint is a multiple of 0.25, so an element's
# code depends only on which quarter (or half) it falls in and on whether it sits exactly on its boundary.


def _spacing(v: float) -> float:
    """The grid's spacing at magnitude v: 0.5 below 2, 1 below 4, 2 above."""
    return 2.0 if v >= 4.0 else 1.0 if v >= 2.0 else 0.5


def _round_to_grid_nearest_even(v: float) -> int:
    """The code nearest v, saturating at 6; a tie goes to the even code (round half to even)."""
    return min(range(len(GRID)), key=lambda code: (abs(GRID[code] - v), code % 2))


HALF_BINS = 16  # t in [k/2, (k+1)/2) for k < 15, the last bin everything from 7.5 on
# Stochastic rounding rounds down on t's own spacing, saturating: the code for each half bin, and a's spacing / 256.
SR_CODE = torch.tensor([GRID.index(min(k / 2 // _spacing(k / 2) * _spacing(k / 2), 6.0)) for k in range(HALF_BINS)],
                       dtype=torch.uint8)
SR_STEP_PER_BYTE = torch.tensor([_spacing(k / 2) / 256.0 for k in range(HALF_BINS)])
QUARTER_CAP = 25.0  # 4|x| capped: every magnitude above 6.25 rounds to 6
# Round to nearest even by quarter n = floor(4|x|): entry 2n is |x| = n/4 exactly (where ties fall), 2n+1 is inside.
RNE_CODE = torch.tensor([_round_to_grid_nearest_even((n + inside / 2) / 4) for n in range(int(QUARTER_CAP) + 1)
                         for inside in (0, 1)], dtype=torch.uint8)


def _magnitude(x: torch.Tensor) -> torch.Tensor:
    """|x| with NaN as 7 (NaN encodes as +6)."""
    return x.abs().nan_to_num_(nan=7.0)


def _with_sign(magnitude_code: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    negative = torch.signbit(x) & ~torch.isnan(x)
    return magnitude_code | (negative.to(torch.uint8) << 3)


def encode_nearest(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (0-15) of fp32 values: round to nearest even, saturating; NaN -> +6."""
    quarters = _magnitude(x).mul_(4.0).clamp_(max=QUARTER_CAP)
    n = quarters.to(torch.int64)
    return _with_sign(RNE_CODE[n.mul(2).add_((quarters != n).to(torch.int64))], x)


def encode_stochastic(x: torch.Tensor, random_bytes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes by stochastic rounding with one random byte per element (ptx.cuh stochastic_round_fp4_e2m1):
    t = |x| + byte / 256 * spacing(|x|), rounded down on t's spacing."""
    a = _magnitude(x)
    half_bin = a.mul(2.0).clamp_(max=HALF_BINS - 1).to(torch.int64)
    t = torch.addcmul(a, random_bytes.float(), SR_STEP_PER_BYTE[half_bin])
    return _with_sign(SR_CODE[t.mul_(2.0).clamp_(max=HALF_BINS - 1).to(torch.int64)], x)


# Decoding by lookup as well: a code's value (8-15 the negatives, 8 is -0), and a packed byte's two values (low
# nibble first), so a GEMM operand decodes in one gather (TE's row-scaled GEMM test runs 4,096 GEMMs per item). The
# byte table is gathered as one int64 word per byte (its two fp32 values' bits): 13x faster than indexing pairs.
SIGNED_VALUES = torch.tensor([*GRID, *(-g for g in GRID)])
BYTE_VALUES = torch.stack([SIGNED_VALUES.repeat(16), SIGNED_VALUES.repeat_interleave(16)], dim=-1)  # (256, 2)
BYTE_WORDS = BYTE_VALUES.view(torch.int64).reshape(256)


def decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of E2M1 codes."""
    return SIGNED_VALUES[codes.long()]


def decode_packed(data: torch.Tensor) -> torch.Tensor:
    """fp32 values of (R, C/2) packed bytes as (R, C): what unpack then decode give."""
    words = BYTE_WORDS.index_select(0, data.reshape(-1).int())
    return words.view(torch.float32).reshape(data.shape[0], data.shape[1] * 2)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """(R, C) codes as (R, C/2) bytes: element 2i in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def unpack(data: torch.Tensor) -> torch.Tensor:
    """(R, C/2) bytes as (R, C) codes (C named: R may be 0, a GEMM over zero tokens)."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], data.shape[1] * 2)


def global_encode_scale(amax: torch.Tensor, e4m3_max: int = int(E4M3_MAX)) -> torch.Tensor:
    """compute_global_encode_scaling_factor_FP4<E4M3_MAX>: S_enc = E4M3_MAX * 6 / amax (fp32), capped; 1 for amax 0
    or S_enc 0. One amax (1,) gives a (1, 1) scale, a row-scaled amax (M,) one per row, (M, 1)."""
    amax = amax.float().reshape(-1, 1)
    scale = torch.minimum(torch.tensor(e4m3_max * E2M1_MAX) / amax, torch.tensor(FP32_MAX))
    return torch.where((amax == 0) | (scale == 0), torch.tensor(1.0), scale)


def block_decode_scales(block_amax: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """compute_decoding_scaling_factor: E4M3 (as float8_e4m3fn) of block_amax * (S_enc / 6), saturating."""
    s_dec_b = torch.minimum(block_amax * (s_enc * RCP_6), torch.tensor(FP32_MAX))
    return s_dec_b.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


CHUNK_ELEMENTS = 1 << 24  # rows encoded at a time: the encoder's temporaries take about 40 B per element


def quantize(x: torch.Tensor, amax: torch.Tensor, two_d: bool = False,
             random_bytes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D fp32 tensor (dims divisible by 16) under the per-tensor amax `amax` (or one per row, row-scaled) as
    (packed E2M1 (M, K/2); compact E4M3 scale bytes (M, K/16)); stochastic rounding when random bytes (one per
    element) are given. Encoded in runs of whole 16-row tiles (every step is local to a block or a row), so a
    16384 x 16384 input fits in this machine's memory."""
    s_enc = global_encode_scale(amax)
    step = max(BLOCK, CHUNK_ELEMENTS // max(x.shape[1], 1) // BLOCK * BLOCK)
    if x.shape[0] <= step:
        return _quantize_rows(x, s_enc, two_d, random_bytes)
    parts = [_quantize_rows(x[i:i + step], s_enc[i:i + step] if s_enc.shape[0] > 1 else s_enc, two_d,
                            None if random_bytes is None else random_bytes[i:i + step])
             for i in range(0, x.shape[0], step)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _quantize_rows(x: torch.Tensor, s_enc: torch.Tensor, two_d: bool,
                   random_bytes: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    s_dec = torch.reciprocal(s_enc)
    rows = BLOCK if two_d else 1
    tile_amax = block_scales.block_amax(xf, rows, BLOCK)
    s_b = block_decode_scales(tile_amax, s_enc)
    inverse = torch.minimum(torch.reciprocal(s_b.float() * s_dec), torch.tensor(FP32_MAX))
    scaled = xf * block_scales.expand(inverse, rows, BLOCK)
    codes = encode_nearest(scaled) if random_bytes is None else encode_stochastic(scaled, random_bytes)
    return pack(codes), s_b.view(torch.uint8).repeat_interleave(rows, 0)


def dequantize(data: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor,
               e4m3_max: int = int(E4M3_MAX)) -> torch.Tensor:
    """fp32 values of packed E2M1 (M, K/2) with compact E4M3 scale bytes (M, K/16) and the per-tensor amax (or one
    per row, row-scaled)."""
    factor = scales.view(torch.float8_e4m3fn).float() * amax.float().reshape(-1, 1) * dequantize_factor(e4m3_max)
    return block_scales.times(decode_packed(data), factor, 1, BLOCK)


def block_products(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """q * s_b in fp32 (exact): what a block-scaled GEMM multiplies before the per-tensor factor."""
    return block_scales.times(decode_packed(data), scales.view(torch.float8_e4m3fn).float(), 1, BLOCK)


def per_tensor_factor(scale: GlobalScale) -> torch.Tensor:
    """amax / (6 * E4M3_MAX): one operand's per-tensor decode factor (its values alone, e.g. for a bias gradient)."""
    return scale.amax.float().reshape(()) * dequantize_factor(scale.e4m3_max)


def gemm_alpha(a: GlobalScale, b: GlobalScale) -> torch.Tensor:
    """cuBLAS's alpha for an NVFP4 GEMM as common/recipe/nvfp4.cu (compute_nvfp4_per_tensor_scale_kernel) computes
    it, left to right in fp32: 1 * amax_A * amax_B * (1 / (6 * 6 * E4M3_MAX_A * E4M3_MAX_B)) (TE main reads each
    operand's nvfp4_e4m3_max; 448 but for 4over6 tensors). Not the product of the two operands' factors: that rounds
    three times and flips bf16 outputs (TE's NVFP4 module tests, dgrad in bf16)."""
    one = torch.ones((), dtype=torch.float32, device=a.amax.device)
    factor_inv = _fp32_reciprocal(E2M1_MAX * E2M1_MAX * a.e4m3_max * b.e4m3_max)
    return one * a.amax.float().reshape(()) * b.amax.float().reshape(()) * factor_inv


# Block partials computed at once, at most this many fp32 elements (the sum itself stays in K order).
PARTIALS_CHUNK_ELEMENTS = 1 << 25


def block_ordered_matmul(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """b (M, K) @ a (K, N) of block-scaled E2M1 products (q * s_b) summed as TE's reference NVFP4 GEMM says the
    tensor core sums them (custom_recipes/reference_nvfp4.py qgemm): each 16-long block of K's inner product in
    fp32, the blocks added to an fp32 accumulator one after another in K order. A block's inner product is exact
    (s_x * s_w has at most 8 significant bits, the sum of 16 E2M1 products at most 12), so only the order across
    blocks rounds; one matmul over K sums in its own order, which differs where block scales span a wide range
    (tests/test_tecpu_nvfp4_block_order.py; on Gaussian data every sum is exact either way)."""
    m, k = b.shape
    n = a.shape[1]
    if k % BLOCK:
        raise RuntimeError(f"NVFP4 GEMM: K={k} is not a multiple of {BLOCK}")
    groups = k // BLOCK
    b_blocks = b.reshape(m, groups, BLOCK).transpose(0, 1)  # (G, M, 16)
    a_blocks = a.reshape(groups, BLOCK, n)  # (G, 16, N)
    out = torch.zeros(m, n, dtype=torch.float32, device=b.device)
    step = max(1, PARTIALS_CHUNK_ELEMENTS // max(1, m * n))
    for start in range(0, groups, step):
        for partial in torch.bmm(b_blocks[start:start + step], a_blocks[start:start + step]):
            out += partial
    return out


def hadamard(x_t: torch.Tensor, rht_matrix: torch.Tensor) -> torch.Tensor:
    """The RHT of the transposed bf16 input (K, M): 16-element runs of each row times rht_matrix, fp32 -> bf16."""
    out = x_t.float().reshape(-1, BLOCK) @ rht_matrix.float()
    return out.reshape(x_t.shape).to(torch.bfloat16)
