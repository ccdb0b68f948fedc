"""Block-scaled quantizers with one planted fault each, as a tex build could have them; each a context manager
patching the emulation's format module for one run (what TE's Python calls goes through these functions).

- e8m0_rounded_down: MXFP8's E8M0 scale takes the floor power of two of amax / fp8_max instead of TE's ceiling
  (the OCP-style rule), so a block whose amax / fp8_max is not a power of two saturates its largest elements.
- neighbouring_block_scale: a block's scales are read from the next block along the blocked dimension (MXFP8 and
  NVFP4 GEMM operands and tex.dequantize; the last block wraps to the first).
- nvfp4_per_tensor_scale_ignored: NVFP4's per-tensor encode scale is taken as 1 (block scales then encode
  amax_block / 6 directly); the stored amax, which dequantization multiplies by, stays the true one.
"""
from __future__ import annotations

import contextlib

import torch

from planting import patched

from te_verify.te.tecpu import block_scales, mxfp8, nvfp4


def e8m0_rounded_down() -> contextlib.AbstractContextManager:
    def wrap(original):
        def round_down(value: torch.Tensor) -> torch.Tensor:
            exponent = (value.float().view(torch.int32) >> mxfp8.FP32_MANTISSA_BITS) & 0xFF
            floor = torch.where(torch.isfinite(value) & (value > 0), exponent, original(value).to(torch.int32))
            return floor.to(torch.uint8)
        return round_down
    return patched(mxfp8, "e8m0_round_up", wrap)


def neighbouring_block_scale() -> contextlib.AbstractContextManager:
    def wrap(original):
        def load(buffer, rows, cols, swizzled, transposed=False):
            scales = original(buffer, rows, cols, swizzled, transposed)
            return torch.roll(scales, -1, dims=0 if transposed else 1)
        return load
    return patched(block_scales, "load", wrap)


def nvfp4_per_tensor_scale_ignored() -> contextlib.AbstractContextManager:
    return patched(nvfp4, "global_encode_scale", lambda original: lambda amax: torch.tensor(1.0))


PLANTED = {"e8m0_rounded_down": e8m0_rounded_down, "neighbouring_block_scale": neighbouring_block_scale,
           "nvfp4_per_tensor_scale_ignored": nvfp4_per_tensor_scale_ignored}
