"""The summation orders of TE's kernels, in fp32: a running sum, CUDA's block reduction, a warp's xor butterfly, a
warp's strided loop, and the fused multiply-add nvcc contracts `acc += a * b` into.

A kernel's sum is exact only in its own order; the emulated kernels that reproduce one (moe_permute.py,
multi_tensor.py, router_scores.py and the fused router's modules) build it from these.
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


LANES = 32  # a warp


def lanes(x: torch.Tensor, fill: float | bool) -> torch.Tensor:
    """A warp's strided loop over the last dimension (`for (i = lane; i < n; i += 32)`): [..., n] as
    [..., 32, ceil(n / 32)], lane l holding x[l], x[l + 32], ... in the order it visits them, padded with `fill`."""
    n = x.shape[-1]
    steps = -(-n // LANES)
    pad = torch.full((*x.shape[:-1], steps * LANES - n), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], -1).reshape(*x.shape[:-1], steps, LANES).transpose(-1, -2)


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fmaf(a, b, c), rounded once, as nvcc's default contraction makes `c += a * b`: the product is exact in
    fp64, and the fp64 sum rounds to fp32 as the exact one does unless it landed exactly on a tie between two fp32
    values (its low 29 bits 1 then 28 zeros; any fp32 subnormal), where its own rounding error (TwoSum) decides."""
    p, c64 = a.double() * b.double(), c.double()
    s = p + c64
    r = s.float()
    suspect = ((s.view(torch.int64) & 0x1FFFFFFF) == 0x10000000) | ((s.abs() < 2.0**-126) & (s != 0))
    if bool(suspect.any()):
        at = suspect.nonzero(as_tuple=True)
        r[at] = _rounded_by_error(p[at], c64[at], s[at], r[at])
    return r


def _rounded_by_error(p: torch.Tensor, c: torch.Tensor, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    back = s - p
    err = (p - (s - back)) + (c - back)
    inf = torch.full_like(r, float("inf"))
    other = torch.nextafter(r, torch.where(s > r.double(), inf, -inf))  # the fp32 neighbour on s's side
    tie = torch.isfinite(r) & torch.isfinite(other) & ((r.double() + other.double()) * 0.5 == s) & (err != 0)
    return torch.where(tie, torch.where(err > 0, torch.maximum(r, other), torch.minimum(r, other)), r)


def warp_sum(x: torch.Tensor, mask: torch.Tensor | None = None, times: torch.Tensor | None = None) -> torch.Tensor:
    """A warp's fp32 sum over the last dimension: each lane accumulates its strided elements (`lanes`) from +0 in
    turn, skipping those off `mask`, `acc += x` or, given `times`, `acc += x * times` as one FMA; then the lanes
    combine by xor-butterfly (warp_reduce_on_shmem, warp_allreduce_sum of per-lane partial sums)."""
    valid = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    xs, ok = lanes(x, 0.0).transpose(-1, -2), lanes(valid, False).transpose(-1, -2)  # [..., step, lane]
    ts = lanes(times, 0.0).transpose(-1, -2) if times is not None else None
    total = torch.zeros_like(xs[..., 0, :])
    for j in range(xs.shape[-2]):
        step = fma(xs[..., j, :], ts[..., j, :], total) if ts is not None else total + xs[..., j, :]
        total = step if mask is None and j < xs.shape[-2] - 1 else torch.where(ok[..., j, :], step, total)
    return xor_butterfly(total)
