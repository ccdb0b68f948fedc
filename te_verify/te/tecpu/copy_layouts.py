"""Which layouts of each quantized copy existed during a run, their bytes, and which GEMMs read which layout: read
from the copies themselves at the tex boundary (each quantize's output, each GEMM's operands), not from TE's flags.

A copy's "rowwise" layout is its rowwise data with its scales (a per-tensor FP8 copy's `_data` and `_scale_inv`),
its "columnwise" layout the columnwise data with its scales (a per-tensor copy's `_transpose`). A GEMM reads A's
rowwise layout iff A is transposed and B's iff B is not (TE's TN fprop: W and x rowwise; NN dgrad: W columnwise,
dy rowwise; NT wgrad: x and dy columnwise).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

LAYOUT_BUFFERS = {"rowwise": ("_data", "_rowwise_data", "_scale_inv", "_rowwise_scale_inv", "_amax_rowwise"),
                  "columnwise": ("_transpose", "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")}
DATA = {"rowwise": ("_data", "_rowwise_data"), "columnwise": ("_transpose", "_columnwise_data")}


@dataclass
class CopySeen:
    """One quantized copy as seen over the run."""

    # Provenance root of the tensor it was quantized from (None where unknown).
    source: Any
    # Layout -> the most bytes it held when seen (data and scales).
    layouts: dict[str, int] = field(default_factory=dict)
    # (GEMM role, layout) pairs that read it.
    read_by: set[tuple[str, str]] = field(default_factory=set)
    # The phase of the run it was first seen in ("forward", "backward").
    phase: str = ""


def _tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.numel() > 0


def layouts_of(copy: Any) -> dict[str, int]:
    """Layout -> bytes of the layouts a quantized copy holds now (a layout whose data is absent does not count)."""
    found = {}
    for layout, names in LAYOUT_BUFFERS.items():
        if getattr(copy, "_transpose_invalid", False) and layout == "columnwise" and hasattr(copy, "_transpose"):
            continue
        if any(_tensor(getattr(copy, n, None)) for n in DATA[layout]):
            buffers = [getattr(copy, n, None) for n in names]
            found[layout] = sum(b.numel() * b.element_size() for b in buffers if _tensor(b))
    return found


def note(copies: dict, key: Any, copy: Any, source: Any, phase: str, read: tuple[str, str] | None = None) -> None:
    """Add what `copy` holds now (and the GEMM read, if any) to its entry under `key`."""
    seen = copies.setdefault(key, CopySeen(source, phase=phase))
    for layout, nbytes in layouts_of(copy).items():
        seen.layouts[layout] = max(seen.layouts.get(layout, 0), nbytes)
    if read is not None:
        seen.read_by.add(read)
