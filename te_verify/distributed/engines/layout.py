"""The training engines' buffer layouts (Wrapped.buffer_layout): which parameter owns which element range of a
collective's tensor, read from the engine's own index of the buffers it communicates, never from their values. An
engine that allocates its buckets uninitialised (Megatron-FSDP) can leave an earlier case's copy of the same seeded
weights in a bucket's padding; content matching would name it, the layout names only what the engine put there."""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from te_verify.distributed.rank.carried import byte_range
from te_verify.distributed.types import Owned

# A region of an engine buffer: (its tensor, the bucket position of its element 0, items as (name, what, bucket
# start, bucket end) in elements).
Region = tuple[torch.Tensor, int, list[tuple[str, str, int, int]]]


def megatron_fsdp_layout(buffers) -> Callable[[torch.Tensor], list[Owned] | None]:
    """Megatron-FSDP's layout, from its ParamAndGradBuffer: every parameter group's model weight (and transpose)
    buffer and main weight buffer hold the values of their parameters, its main grad buffer their gradients, each
    item at `item_index_map[item_id]` in bucket coordinates (build_data_parallel_buffer_index; the rest of the
    bucket is padding). A buffer's persistent `data` is the whole bucket where unsharded and the rank's shard from
    `shard_bucket_index.bucket_data_index` where sharded (DataParallelBuffer.get_shard_from_local_buffer); its
    temporary bucket (the allocator's, by bucket id: an all-gather's output, a sharded reduce-scatter's input) is
    the whole bucket. Read at call time: temporary buckets come and go."""

    def regions() -> Iterator[Region]:
        for group in buffers.parameter_groups:
            for buf, what in ((group.model_weight_buffer, "values"), (group.transpose_weight_buffer, "values"),
                              (group.main_weight_buffer, "values"), (group.main_grad_buffer, "grad")):
                if buf is None:
                    continue
                items = bucket_items(buf, what, buffers.param_to_name)
                if getattr(buf, "data", None) is not None:
                    start = buf.shard_bucket_index.bucket_data_index if buf.is_data_distributed else 0
                    yield buf.data, start, items
                bucket = buf.temporary_bucket_allocator.buckets.get(buf.bucket_index.bucket_id)
                if bucket is not None:
                    yield bucket.data, 0, items

    return lambda tensor: owned_ranges(tensor, regions())


def bucket_items(buf, what: str, names: dict) -> list[tuple[str, str, int, int]]:
    """(name, what, start, end) of each of a DataParallelBuffer's parameters, in elements of its bucket."""
    base = buf.bucket_index.global_data_index
    return [(names[p], what, buf.item_index_map[i].global_data_index - base,
             buf.item_index_map[i].global_data_index - base + buf.item_index_map[i].size)
            for i, p in enumerate(buf.params)]


def owned_ranges(tensor: torch.Tensor, regions: Iterator[Region]) -> list[Owned] | None:
    """(name, what, first element, end element) of `tensor` for every item of the regions it lies on; None where it
    lies on none (not the engine's buffer: the caller's storage and content matching name it)."""
    span = byte_range(tensor)
    if span is None:
        return None
    found, on_engine = [], False
    for data, start, items in regions:
        region = live_range(data)
        if region is None or min(region[1], span[1]) <= max(region[0], span[0]):
            continue
        on_engine, size, unit = True, data.element_size(), tensor.element_size()
        for name, what, lo, hi in items:
            a = max(region[0] + (lo - start) * size, span[0])
            b = min(region[0] + (hi - start) * size, span[1], region[1])
            if b > a:
                found.append((name, what, (a - span[0]) // unit, (b - span[0]) // unit))
    return found if on_engine else None


def live_range(t: torch.Tensor) -> tuple[int, int] | None:
    """A region's bytes while its storage holds them (Megatron-FSDP frees a temporary bucket by resizing its storage
    to 0, keeping the tensor)."""
    span = byte_range(t)
    if span is None or t.untyped_storage().nbytes() < (t.storage_offset() + t.numel()) * t.element_size():
        return None
    return span
