"""Which way a GEMM reads a layer's weight, through views and copies of it: its role in backward.

A weight W (out, in) enters a GEMM contracted over its in-features (a forward product, or a recompute of one in
backward: "fprop") or over its out-features (a "dgrad"). Which it is shows in the operand's strides, read against
the strides of W's two axes in the storage the operand views ("axes": (in-feature stride, out-feature stride)). A
weight's own storage has its Parameter's strides; a copy of it (an fp64 or FP8 cast, a transposed `.contiguous()`)
has the copy's own, worked out when the copy is made from its source's (`copy_axes`), so a slice, transpose or
broadcast of the copy reads as one of the weight would.
"""
from __future__ import annotations

import torch

Axes = tuple[int, int]  # (stride of the in-feature axis, stride of the out-feature axis) in one storage


def weight_axes(weight: torch.Tensor) -> Axes | None:
    """A 2-D weight's axes in its own storage (None for a flat shard or a wrapper without plain strides)."""
    if weight.dim() != 2 or type(weight) not in (torch.Tensor, torch.nn.Parameter):
        return None
    return weight.stride(1), weight.stride(0)


def _dim_with_stride(t: torch.Tensor, stride: int) -> int | None:
    dims = [d for d in range(t.dim()) if t.shape[d] > 1 and t.stride(d) == stride]
    return dims[0] if len(dims) == 1 else None


def copy_axes(source: torch.Tensor, source_axes: Axes, copy: torch.Tensor) -> Axes | None:
    """The weight's axes in `copy`'s storage, an elementwise copy of `source` (same shape), whose storage holds the
    weight's axes at `source_axes`. None where the copy reshapes, or the source shows either axis ambiguously."""
    if copy.shape != source.shape or source_axes[0] == source_axes[1]:
        return None
    in_dim, out_dim = (_dim_with_stride(source, s) for s in source_axes)
    if in_dim is None or out_dim is None:
        return None
    return copy.stride(in_dim), copy.stride(out_dim)


def contracts_in(t: torch.Tensor, position: int, weight_shape: tuple[int, ...], axes: Axes | None) -> bool:
    """Whether GEMM operand `t` (position 0: (..., m, k), 1: (..., k, n)), a view of a storage holding a layer's
    weight of `weight_shape` (out, in) with `axes`, is contracted over the weight's in-features: its contracted
    dimension walks the in-feature axis. Where strides cannot tell (a dimension of 1) the sizes do. Axes unknown (a
    copy that reshaped) or a rank-1 weight: read as a dgrad."""
    out_features, in_features = weight_shape[0], weight_shape[-1]
    if axes is None or min(out_features, in_features) == 1:
        return False
    dim = -1 if position == 0 or t.dim() == 1 else -2
    if t.shape[dim] > 1:
        return t.stride(dim) == axes[0]
    return t.shape[dim] == in_features != out_features
