"""FSDP2 under a mixed-precision policy with one planted fault (the pool's `wrap=`): a user who writes
`MixedPrecisionPolicy(param_dtype=torch.bfloat16)` and leaves reduce_dtype unset gets FSDP2's default, a reduction
in the param dtype (bf16), where the spec's policy says fp32. Its clean twin sets both, as the spec says."""
from __future__ import annotations

import dataclasses

from te_verify.distributed.types import Wrapped
from te_verify.distributed.wrappers import wrap_fsdp2


def fsdp2_reduce_dtype_unset(model, spec) -> Wrapped:
    """FSDP2 built with the spec's param dtype and no reduce dtype: it reduces gradients in bf16."""
    return wrap_fsdp2(model, spec.replace(dist=dataclasses.replace(spec.dist, reduce_dtype="")))


def fsdp2_policy_as_specified(model, spec) -> Wrapped:
    """The clean twin: FSDP2 with both dtypes of the spec's policy."""
    return wrap_fsdp2(model, spec)


def fsdp2_policy_grad_one_percent_high(model, spec) -> Wrapped:
    """The policy as specified, whose full gradient of 2.weight reads 1% too large: the policy's truth bound (derived
    from bf16's unit roundoff, not loosened) must still see a 1% error."""
    wrapped = wrap_fsdp2(model, spec)
    read = wrapped.full_grads

    def full_grads() -> dict:
        grads = read()
        grads["2.weight"] = grads["2.weight"] * 1.01
        return grads

    wrapped.full_grads = full_grads
    return wrapped
