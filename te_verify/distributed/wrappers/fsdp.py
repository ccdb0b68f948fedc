"""FSDP1: one unit per layer or block, use_orig_params, on the rank's device (its gathered layout: flat_layout)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.distributed.policy import policy_dtypes
from te_verify.distributed.types import (Wrapped, WrapperError, grad_of, options, param_slots, param_tensors,
                                         storage_bytes, units_of, value_of)
from te_verify.spec import CaseSpec


def wrap_fsdp1(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    opts = options(spec)
    strategy = opts.pop("sharding", "FULL_SHARD")
    if opts or strategy not in ShardingStrategy.__members__:
        raise WrapperError(f"dist.options {spec.dist.options!r}: FSDP1 takes sharding=FULL_SHARD|SHARD_GRAD_OP|NO_SHARD")
    slots, layers = param_slots(model), units_of(model, spec)
    # One FSDP unit per unit (a stack's nn.Linear layers, a family's blocks), as a user wraps a transformer.
    param_dtype, reduce_dtype = policy_dtypes(spec)  # the spec's policy (None: FSDP1's default, no casts)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({type(u) for u in layers}), device_id=run_device.active(),
                use_orig_params=True, sharding_strategy=ShardingStrategy[strategy],
                mixed_precision=MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
                if param_dtype or reduce_dtype else None)
    units = [m for m in fsdp.modules() if isinstance(m, FSDP) and m is not fsdp]

    def full_grads() -> dict:
        with FSDP.summon_full_params(fsdp, with_grads=True):
            return param_tensors(slots, grad_of)

    def full_params() -> dict:
        with FSDP.summon_full_params(fsdp):
            return param_tensors(slots, value_of)

    def gathered() -> list[int]:
        return [storage_bytes(getattr(u._handle.flat_param, "_full_param_padded", None)) if u._handle else 0
                for u in units]

    return Wrapped(fsdp, layers, full_grads, full_params, gathered, dist.get_world_size(), no_sync=fsdp.no_sync)
