"""How a flattening wrapper lays out a unit's unsharded (gathered) parameter, so that gathered_peak's required figure
holds the bytes the wrapper must gather, padding included, and not a byte more.

FSDP1 with use_orig_params (wrappers.fsdp; torch's FlatParamHandle): each original parameter starts at a 16-byte
aligned offset of the flat parameter, counted in the dtype it computes in (the policy's param dtype, else the
parameters'), and the flat parameter is padded to a multiple of the world size in elements (its shards are equal).
A (7, 3) weight and its bias in bf16: 21 elements, 3 of padding, 3, then 1 to an even count: 56 B where the values
hold 48.
"""
from __future__ import annotations

from typing import Callable

ALIGN_BYTES = 16


def fsdp1_unsharded_bytes(numels: tuple[int, ...], itemsize: int, world_size: int) -> int:
    """Bytes of an FSDP1 unit's gathered flat parameter holding parameters of `numels` (in registration order)."""
    align = max(1, ALIGN_BYTES // itemsize)
    total = 0
    for numel in numels:
        total += (-total) % align + numel
    total += (-total) % world_size
    return total * itemsize


# Wrapper -> its layout (numels, itemsize, world size -> gathered bytes); a wrapper not named gathers the values alone.
LAYOUTS: dict[str, Callable[[tuple[int, ...], int, int], int]] = {"fsdp": fsdp1_unsharded_bytes}
