"""The summation orders of TE's kernels, in fp32: a running sum, CUDA's block reduction and a warp's xor butterfly.

A kernel's sum is exact only in its own order; the emulated kernels that reproduce one (moe_permute.py,
multi_tensor.py) build it from these.
"""
from __future__ import annotations

import torch


def running_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Left to right along `dim`, from +0: ((0 + x0) + x1) + ..., as a thread's loop accumulates."""
    total = torch.zeros_like(x.select(dim, 0))
    for i in range(x.shape[dim]):
        total = total + x.select(dim, i)
    return total


def block_reduce(values: torch.Tensor) -> torch.Tensor:
    """reduce_block_into_lanes over the last dimension (512 threads' values): x[t] += x[t + i] for i = 256, 128, 64;
    then x[t] + x[t + 32] for the first warp and a shuffle-down over 16 .. 1; thread 0's result."""
    x = values
    for half in (256, 128, 64, 32):
        x = x[..., :half] + x[..., half:2 * half]
    for offset in (16, 8, 4, 2, 1):
        x = x[..., :offset] + x[..., offset:2 * offset]
    return x[..., 0]


def xor_butterfly(lanes: torch.Tensor) -> torch.Tensor:
    """A warp's 32 values (last dimension) combined by xor-shuffle, masks 16 .. 1: lane 0's result."""
    index = torch.arange(lanes.shape[-1], device=lanes.device)
    for mask in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[..., index ^ mask]
    return lanes[..., 0]
