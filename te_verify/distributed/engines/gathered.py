"""The training engines' gathered-parameter probes (Wrapped.gathered_bytes, the reshard timeline's reading): per
layer, the bytes of full parameter storage it holds now, read from the storage itself, never from a status flag."""
from __future__ import annotations

from typing import Callable

from torch import nn


def zero3_gathered(layers: list[nn.Module]) -> Callable[[], list[int]]:
    """ZeRO-3's gathered-parameter probe: per layer, the bytes of full parameter storage it holds now. ZeRO-3 frees a
    partitioned parameter by pointing `param.data` at an empty tensor (partition_parameters.free_param) and gathers
    it by pointing `param.data` at the full tensor (its ds_status then AVAILABLE): the elements `param.data` holds
    are what the rank keeps, whatever the status says. A persistent parameter (ds_persist: at most
    stage3_param_persistence_threshold elements) is by configuration never partitioned -- held whole, as an
    unsharded wrapper holds it, not gathered for compute -- and is not counted."""

    def gathered() -> list[int]:
        return [sum(p.data.numel() * p.data.element_size() for p in layer.parameters() if not p.ds_persist)
                for layer in layers]

    return gathered


def megatron_fsdp_gathered(buffers, model: nn.Module, layers: list[nn.Module]) -> Callable[[], list[int]]:
    """Megatron-FSDP's gathered-parameter probe: per nn.Linear unit, the bytes of unsharded parameter bucket storage
    it holds now. A unit's parameters live in parameter groups (ParamAndGradBuffer.param_to_param_group, keyed by the
    raw parameters: the module holds distributed ones between steps, so they are matched by name); where a
    group's weight buffer is sharded (optim_grads_params) its unsharded bucket is a temporary one its allocator holds
    by bucket id, allocated for the all-gather and freed by resizing its storage to 0 (param_and_grad_buffer.py
    _alloc_storage / _free_storage, AllGatherPipeline.release_bucket). The bucket's layout padding (its size less
    its parameters' elements: slack's reading) is not counted: the checks compare with parameter bytes. A replicated
    buffer (no_shard, optim, optim_grads) gathers into storage it keeps, and counts nothing."""
    group_of = {buffers.param_to_name[p]: g for p, g in buffers.param_to_param_group.items()}
    prefix = {id(m): name for name, m in model.named_modules()}
    units = [sorted({group_of[f"{prefix[id(layer)]}.{attr}"] for attr, _ in layer.named_parameters()})
             for layer in layers]

    def gathered() -> list[int]:
        return [sum(bucket_bytes(buf) for g in unit for buf in (buffers.parameter_groups[g].model_weight_buffer,
                                                               buffers.parameter_groups[g].transpose_weight_buffer))
                for unit in units]

    return gathered


def bucket_bytes(buf) -> int:
    """Bytes of a sharded buffer's unsharded bucket storage now, less its layout padding."""
    if buf is None or not buf.is_data_distributed:
        return 0
    bucket = buf.temporary_bucket_allocator.buckets.get(buf.bucket_index.bucket_id)
    held = 0 if bucket is None else bucket.data.untyped_storage().nbytes()
    padding = (buf.bucket_index.size - sum(p.numel() for p in buf.params)) * buf.dtype.itemsize
    return max(0, held - padding)
