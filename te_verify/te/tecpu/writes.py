"""Writes into tensors the emulated kernels were handed, and reads of them, as a CUDA kernel makes them: through the
pointer.

TE's Python allocates state and buffers the kernels later fill (a delayed-scaling quantizer's amax and scale, the
recipe's amax history, a cached quantized weight, `out=` arguments). Allocated under `torch.inference_mode()` (an
inference pass) they are inference tensors, which PyTorch refuses to update in place outside that mode; TE's C++
writes them anyway (its kernels take data pointers, below autograd), and the next training step relies on it.
"""
from __future__ import annotations

import contextlib

import torch

from te_verify.te.tecpu.strict import refuse


def write(dst: torch.Tensor, value: torch.Tensor | float) -> torch.Tensor:
    """dst[...] = value, also where dst is an inference tensor written outside inference mode; returns dst."""
    outside = dst.is_inference() and not torch.is_inference_mode_enabled()
    with torch.inference_mode() if outside else contextlib.nullcontext():
        return dst.copy_(value) if isinstance(value, torch.Tensor) else dst.fill_(value)


def memory(x: torch.Tensor, what: str = "a kernel") -> torch.Tensor:
    """x's numel elements from its data pointer (a view), as a kernel given x's shape addresses them (strides ignored);
    a non-contiguous x whose elements would run past its storage is refused, naming `what` reads it."""
    if x.is_contiguous():
        return x.view(-1)
    if x.storage_offset() + x.numel() > x.untyped_storage().nbytes() // x.element_size():
        refuse(f"{what} reading a non-contiguous {tuple(x.shape)} tensor past its storage")
    return x.as_strided((x.numel(),), (1,), x.storage_offset())
