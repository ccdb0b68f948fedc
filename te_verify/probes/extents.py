"""Where a view's bytes lie in its storage (an `Extent`), so layer inputs are matched by overlapping bytes, not by exact
view.

A layer's forward input is recorded as a region: the extent of the view its forward GEMM read, or, where that
operand was a followed copy (a cast, an FP8 quantize), of the view the copy was made from (`Watcher._note_copy`
records each copy's source extent when it makes the copy). A backward GEMM whose operand is a slice of that input,
or a copy of a slice of it (split-K's wgrad over a cast of an expert's row half), overlaps the region's bytes and is
that layer's, once the region still holds the data it held in the forward (read back here, summed by the caller).
A storage is held by weak reference only: the probes never keep a run's tensors alive.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from te_verify.te.tecpu.record import byte_span


@dataclass(frozen=True)
class Extent:
    """One view of one storage: the storage's key and object, the byte span the view can touch, its geometry."""

    key: Any
    start: int
    end: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    storage: weakref.ref

    def overlaps(self, other: "Extent") -> bool:
        """Shares bytes of the same storage with `other`, read as elements of the same size."""
        return (self.key == other.key and self.start < other.end and other.start < self.end
                and self.dtype.itemsize == other.dtype.itemsize)

    def read(self) -> torch.Tensor | None:
        """The view over its storage as it is now; None once the storage is gone or was resized below it."""
        storage = self.storage()
        if storage is None or storage.nbytes() < self.end:
            return None
        return torch.empty(0, dtype=self.dtype, device=storage.device).set_(storage, self.offset, self.shape,
                                                                             self.stride)


def extent_of(key: Any, t: torch.Tensor) -> Extent:
    """`t`'s extent in its storage, whose key (`Watcher.key`) is `key`."""
    start, end = byte_span(t)
    return Extent(key, start, end, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
                  weakref.ref(t.untyped_storage()))


def overlapping(regions: list[tuple[Extent, tuple]], probe: Extent) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(view, its data now) of every region sharing bytes with `probe` whose storage still holds it."""
    for region, view in regions:
        if region.overlaps(probe) and (whole := region.read()) is not None:
            yield view, whole
