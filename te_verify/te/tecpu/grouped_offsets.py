"""Grouped-tensor offsets from split sizes: tex.splits_to_offsets and tex.splits_to_offsets_multi (TE >= 2.20;
csrc/extensions/misc.cpp over common/util/splits_to_offsets.cu).

GroupedLinear's grouped-tensor path and te.ops' grouped MLP call them to turn each group's row count into the
element offsets of the group's input, output and scale buffers. The kernel's definition: output i holds the inclusive
prefix sums of the int64 split sizes times strides[i], after a leading 0 where include_leading_zero[i], in dtypes[i]
(int32 or int64; an int32 output keeps the low 32 bits, as the kernel's static_cast does).
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu.device import EMULATED

_INT_DTYPES = (torch.int32, torch.int64)


def _split_sizes(split_sizes: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(split_sizes, torch.Tensor):  # pybind's at::Tensor argument takes no list
        raise TypeError(f"{name}(): split sizes must be a tensor, got {type(split_sizes).__name__}")
    if split_sizes.dtype not in _INT_DTYPES:
        raise RuntimeError(f"{name}(): unsupported dtype for split_sizes {split_sizes.dtype} (expected int32 or int64)")
    return split_sizes.to(device=EMULATED, dtype=torch.int64).reshape(-1)


def _scan(sizes: torch.Tensor, stride: int, leading_zero: bool, dtype: torch.dtype) -> torch.Tensor:
    sums = torch.cumsum(sizes, dim=0) * stride
    if leading_zero:
        sums = torch.cat((torch.zeros(1, dtype=torch.int64, device=EMULATED), sums))
    if dtype not in _INT_DTYPES:
        raise RuntimeError(f"splits_to_offsets_multi(): unsupported output dtype {dtype} (expected int32 or int64)")
    # The kernel stores static_cast<int32_t>(value): the low 32 bits, two's complement.
    return sums.to(dtype) if dtype == torch.int64 else ((sums + 2**31) % 2**32 - 2**31).to(torch.int32)


def splits_to_offsets(first_dims: torch.Tensor, logical_last_dim: int) -> torch.Tensor:
    """[0, d0*L, (d0+d1)*L, ...]: the element offset of each group of a [sum(first_dims), L] grouped tensor."""
    if first_dims.dtype != torch.int64 or first_dims.dim() != 1:
        raise RuntimeError("splits_to_offsets(): first_dims must be a 1D tensor of dtype int64")
    if logical_last_dim <= 0:
        raise RuntimeError("splits_to_offsets(): logical_last_dim must be greater than 0")
    return _scan(_split_sizes(first_dims, "splits_to_offsets"), logical_last_dim, True, torch.int64)


def splits_to_offsets_multi(split_sizes: torch.Tensor, device: Any, *, strides: list[int],
                            include_leading_zero: list[bool], dtypes: list[torch.dtype],
                            bulk_allocate: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the split sizes as int64 on the device, one offsets tensor per stride). `bulk_allocate` places the outputs in
    one 16-byte-aligned buffer on a GPU, an allocation detail with the same values."""
    if not len(strides) == len(include_leading_zero) == len(dtypes):
        raise RuntimeError(f"splits_to_offsets_multi(): strides, include_leading_zero, and dtypes must have matching "
                           f"lengths, but got {len(strides)}, {len(include_leading_zero)}, and {len(dtypes)}")
    sizes = _split_sizes(split_sizes, "splits_to_offsets_multi")
    return sizes, [_scan(sizes, s, z, d) for s, z, d in zip(strides, include_leading_zero, dtypes)]


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"splits_to_offsets": splits_to_offsets, "splits_to_offsets_multi": splits_to_offsets_multi}
