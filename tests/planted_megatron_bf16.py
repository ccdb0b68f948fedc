"""Megatron-core DDP under a bf16 policy (engines.megatron_bf16), with planted faults (the pool's `wrap=`):

- `megatron_bf16_ignoring_grad_reduce_in_fp32`: an engine wrapper that builds DDP without grad_reduce_in_fp32 where
  the spec's policy says fp32 (its grad buffer, main_grad and all-reduce then in bf16).
The clean twins are the engine as the spec configures it, and the same policy with the distributed optimizer (fp32
master shards of every bucket, a bf16 parameter all-gather after the step): a different correct implementation."""
from __future__ import annotations

import dataclasses

from te_verify.distributed.engines import megatron_ddp
from te_verify.distributed.types import Wrapped


def megatron_bf16_ignoring_grad_reduce_in_fp32(model, spec) -> Wrapped:
    return megatron_ddp.wrap(model, spec.replace(dist=dataclasses.replace(spec.dist, reduce_dtype="bf16")))


def megatron_bf16_as_specified(model, spec) -> Wrapped:
    return megatron_ddp.wrap(model, spec)
