"""Megatron-FSDP with planted stale memory (the pool's `wrap=`): its buckets are allocated uninitialised, so an
earlier case's copy of the same seeded weights can be left in a bucket's padding. Planted here: every sharded model
weight bucket's padding on this rank holds a whole frozen parameter's values, where one fits."""
from __future__ import annotations

import torch

from te_verify.distributed.engines import megatron_fsdp
from te_verify.distributed.types import Wrapped


def padding(buf) -> list[tuple[int, int]]:
    """[start, end) runs of `buf.data` (this rank's shard of the bucket) that no parameter owns."""
    start = buf.shard_bucket_index.bucket_data_index
    owned = torch.zeros(buf.bucket_index.size, dtype=torch.bool)
    for index in buf.item_index_map.values():
        owned[index.global_data_index:index.global_data_index + index.size] = True
    free = (~owned[start:start + buf.data.numel()]).tolist() + [False]
    runs, lo = [], None
    for i, is_free in enumerate(free):
        if is_free and lo is None:
            lo = i
        elif not is_free and lo is not None:
            runs.append((lo, i))
            lo = None
    return runs


def megatron_fsdp_with_stale_padding(model, spec) -> Wrapped:
    """Megatron-FSDP whose trainable units' sharded weight buckets hold, in their padding, the largest frozen
    parameter that fits there."""
    frozen = [p.detach().reshape(-1).clone() for p in model.parameters() if not p.requires_grad]
    wrapped = megatron_fsdp.wrap(model, spec)
    for group in wrapped.module.param_and_grad_buffer.parameter_groups:
        buf = group.model_weight_buffer
        for lo, hi in padding(buf) if group.requires_grad and buf.is_data_distributed else ():
            fits = [v for v in frozen if v.numel() <= hi - lo]
            if fits:
                value = max(fits, key=torch.Tensor.numel)
                buf.data[lo:lo + value.numel()] = value.to(buf.dtype)
    return wrapped


def megatron_fsdp_stale_by_content(model, spec) -> Wrapped:
    """The same stale padding, named by content alone: no declared buffer layout."""
    wrapped = megatron_fsdp_with_stale_padding(model, spec)
    wrapped.buffer_layout = None
    return wrapped
