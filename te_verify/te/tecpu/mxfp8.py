"""MXFP8 (OCP Microscaling Formats MX v1.0): E4M3/E5M2 elements, one E8M0 scale per 32 consecutive elements.

E8M0 (OCP MX v1.0 §5.4.1): an unsigned 8-bit exponent, value 2^(e - 127); 0xFF is NaN; no zero, no sign.
Rowwise blocks are 1x32 along the last dim, columnwise blocks 32x1 over the same logical matrix (the columnwise
data is not transposed); the two are quantized independently from the high-precision input. With 2D quantization
(MXFP8BlockScaling(enable_2d_quantization=True) weights) one scale serves a 32x32 block in both directions.

The scale rule is TE's, not OCP's (OCP: X = 2^(floor(log2 amax) - emax_elem), out-of-range elements
implementation-defined). TE 2.20.2's kernel (common/cast/mxfp8/quantize_mxfp8.cuh) computes, in fp32,
  e = float_to_e8m0(amax * max_norm_rcp)     max_norm_rcp = fp32(1 / 448) for E4M3, fp32(1 / 57344) for E5M2
where float_to_e8m0 (common/util/ptx_arch_spec.cuh; PTX cvt.rp.satfinite.ue8m0x2.f32 on Blackwell) rounds up to a
power of two: NaN -> 0xFF, inf -> 0xFE, 0 -> 0x00, else the fp32 exponent, +1 if the mantissa is non-zero (not past
0xFE; an fp32 subnormal <= 2^-127 stays 0x00). So scale_inv = 2^ceil(log2(amax / fp8_max)) and |x| / scale_inv
never exceeds the format's max. Elements: cvt.rn.satfinite(x * exp2f_rcp(e)) (round to nearest even, saturating
to the largest finite value, NaN kept), with exp2f_rcp(e) = 2^(127 - e) exactly (common/util/ptx.cuh). The block
amax skips NaN elements (fmaxf from 0). Dequantization (common/cast/mxfp8/dequantize_mxfp8.cuh): x * exp2f(e),
exp2f(e) = 2^(e - 127), NaN for 0xFF.
"""
from __future__ import annotations

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_scales

BLOCK = 32
E8M0_NAN, E8M0_INF = 255, 254  # float_to_e8m0 of NaN, of inf (satfinite: the largest finite exponent)
FP32_MANTISSA_BITS = 23
# Quantized_Limits<OType>::max_norm_rcp: 1 / max_norm rounded to fp32 (the kernel multiplies by it, never divides).
MAX_NORM_RCP = {dtype: torch.tensor(1.0 / m, dtype=torch.float32) for dtype, m in fp8.FP8_MAX.items()}


def e8m0_round_up(value: torch.Tensor) -> torch.Tensor:
    """ptx::float_to_e8m0 of non-negative fp32 values: the biased exponent of the next power of two >= value."""
    bits = value.float().view(torch.int32)
    exponent = (bits >> FP32_MANTISSA_BITS) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + up.to(torch.int32)
    e = torch.where(value == 0, 0, e)
    e = torch.where(torch.isinf(value), E8M0_INF, e)
    e = torch.where(torch.isnan(value), E8M0_NAN, e)
    return e.to(torch.uint8)


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def e8m0_reciprocal(e: torch.Tensor) -> torch.Tensor:
    """ptx::exp2f_rcp<float>: 2^(127 - e) in fp32 (2^-127 is a subnormal, built from its bits), NaN for 0xFF."""
    e = e.to(torch.int32)
    bits = torch.where(e == 254, 0x00400000, (254 - e) << FP32_MANTISSA_BITS)
    return torch.where(e == E8M0_NAN, float("nan"), _from_bits(bits))


def e8m0_value(e: torch.Tensor) -> torch.Tensor:
    """ptx::exp2f: 2^(e - 127) in fp32, NaN for 0xFF."""
    e = e.to(torch.int32)
    bits = torch.where(e == 0, 0x00400000, e << FP32_MANTISSA_BITS)
    return torch.where(e == E8M0_NAN, float("nan"), _from_bits(bits))


def block_shape(columnwise: bool, two_d: bool) -> tuple[int, int]:
    """Rows x columns of one scale's block."""
    if two_d:
        return BLOCK, BLOCK
    return (BLOCK, 1) if columnwise else (1, BLOCK)


def quantize(x: torch.Tensor, dtype: torch.dtype, columnwise: bool,
             two_d: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D tensor (dims divisible by 32) as (FP8 bytes, same shape; compact E8M0 scales: (M, K/32) rowwise,
    (M/32, K) columnwise)."""
    xf = x.float()
    rows, cols = block_shape(columnwise, two_d)
    e = e8m0_round_up(block_scales.block_amax(xf, rows, cols) * MAX_NORM_RCP[dtype])
    data = fp8.quantize(xf, block_scales.expand(e8m0_reciprocal(e), rows, cols), dtype).view(torch.uint8)
    if two_d:  # the 32x32 block's scale, stored per 1x32 (rowwise) or 32x1 (columnwise) block
        e = e.repeat_interleave(BLOCK, 1) if columnwise else e.repeat_interleave(BLOCK, 0)
    return data, e


def dequantize(data: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, columnwise: bool) -> torch.Tensor:
    """fp32 values of FP8 bytes (M, K) with their compact E8M0 scales."""
    rows, cols = block_shape(columnwise, False)
    return data.view(dtype).float() * block_scales.expand(e8m0_value(scales), rows, cols)
