"""Megatron-FSDP under a bf16 policy (engines.megatron_fsdp_bf16), with a planted fault (the pool's `wrap=`):

- `megatron_fsdp_bf16_reduce_in_bf16`: an engine wrapper that sets grad_comm_dtype to bf16 where the spec's policy
  says fp32 (each reduce-scatter then carries the gradients in bf16, accumulated into the fp32 main grads).
The clean twins are the engine as the spec configures it, and the same policy with grad_comm_dtype left unset
(Megatron-FSDP then reduces in main_grads_dtype, fp32): a different correct configuration."""
from __future__ import annotations

import dataclasses

from planting import patched
from te_verify.distributed.engines import megatron_fsdp, megatron_fsdp_bf16
from te_verify.distributed.types import Wrapped


def megatron_fsdp_bf16_reduce_in_bf16(model, spec) -> Wrapped:
    return megatron_fsdp.wrap(model, spec.replace(dist=dataclasses.replace(spec.dist, reduce_dtype="bf16")))


def megatron_fsdp_bf16_as_specified(model, spec) -> Wrapped:
    return megatron_fsdp.wrap(model, spec)


def _comm_dtype_unset(original):
    return lambda spec: {**original(spec), "grad_comm_dtype": None}


def megatron_fsdp_bf16_comm_in_main_grads_dtype(model, spec) -> Wrapped:
    with patched(megatron_fsdp_bf16, "policy_fields", _comm_dtype_unset):
        return megatron_fsdp.wrap(model, spec)
