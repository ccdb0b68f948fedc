"""Writes into tensors the emulated kernels were handed, as a CUDA kernel makes them: through the pointer.

TE's Python allocates state and buffers the kernels later fill (a delayed-scaling quantizer's amax and scale, the
recipe's amax history, a cached quantized weight, `out=` arguments). Allocated under `torch.inference_mode()` (an
inference pass) they are inference tensors, which PyTorch refuses to update in place outside that mode; TE's C++
writes them anyway (its kernels take data pointers, below autograd), and the next training step relies on it.
"""
from __future__ import annotations

import contextlib

import torch


def write(dst: torch.Tensor, value: torch.Tensor | float) -> torch.Tensor:
    """dst[...] = value, also where dst is an inference tensor written outside inference mode; returns dst."""
    outside = dst.is_inference() and not torch.is_inference_mode_enabled()
    with torch.inference_mode() if outside else contextlib.nullcontext():
        return dst.copy_(value) if isinstance(value, torch.Tensor) else dst.fill_(value)
