"""The FP8 cast every emulation in the suite shares: scale, saturate, round with torch's float8 casts.

TE's cast kernels convert with saturation to the largest finite value (cvt.rn.satfinite); torch's cast alone
would give NaN (E4M3) or inf (E5M2) out of range, so values are clamped first, and a NaN becomes the positive NaN
0x7F as the instruction gives it (torch keeps a NaN's sign: 0xFF). Measured on an H200 over all 2^32 fp32 inputs
(scripts/device_check_fp8_cast.py): with that, every byte of both formats equals the hardware's. Sharing one function keeps the
reference and the tex emulation bit-identical by construction (tests/test_fp8_cast.py checks it against
torch's casts).
"""
from __future__ import annotations

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def quantize(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """x * scale in fp32, saturated to the format's largest finite value, then cast to `dtype`."""
    fp8_max = FP8_MAX[dtype]
    scaled = (x.float() * scale).clamp(-fp8_max, fp8_max)
    if torch.isnan(scaled).any():  # only then: a plain chain of one-input ops lets the probes follow the copy
        scaled = torch.where(torch.isnan(scaled), scaled.abs(), scaled)
    return scaled.to(dtype)


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    return data.float() * scale_inv


def fp8_dims_ok(shape: tuple[int, ...]) -> bool:
    """TE's check_dim_for_fp8_exec: last dim divisible by 16, product of the others by 8."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return len(shape) >= 1 and shape[-1] % 16 == 0 and rows % 8 == 0
