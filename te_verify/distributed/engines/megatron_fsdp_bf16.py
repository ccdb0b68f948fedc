"""Megatron-FSDP (megatron-fsdp 0.6.1) under a bf16 policy (DistConfig.param_dtype / reduce_dtype): bf16 parameters,
fp32 main weights, fp32 main gradients, gradient reductions in the policy's reduce dtype.

As Megatron-FSDP trains in bf16: it computes in the dtype of the model's own parameters and keeps its main weights
and main gradients in the dtypes its `MixedPrecisionPolicy` names (mixed_precision.py:379-410), passed as
`fully_shard(..., mixed_precision_policy=)` (fully_shard.py:91). So the user's model is cast to bf16 in place before
wrapping (training starts from the fp32 parameters' rounding: Engine.casts_params_to), the batch is cast to bf16 as a
user casts it (deepspeed_bf16.cast_inputs), and the policy is `main_params_dtype=float32` (the optimizer's
distributed parameters are fp32 main weights, copied back rounded into the bf16 compute weights after each step:
install_optimized_model_weights), `main_grads_dtype=float32` (every bf16 wgrad accumulated into an fp32 main grad)
and `grad_comm_dtype` from the policy's reduce dtype (the dtype each reduce-scatter / all-reduce carries:
param_and_grad_buffer.py:4046-4070; its default, None, is main_grads_dtype's). The output stays bf16, as eager's
under torch.autocast.

The lane reads the optimizer's distributed parameters (the fp32 main weights; a frozen parameter's is its bf16 value
widened, as deepspeed_bf16.master_value reads one) and its distributed gradients (the fp32 main grads): as
megatron_fsdp.py reads them without a policy.
"""
from __future__ import annotations

import torch
from torch import nn

from te_verify.distributed.policy import TORCH_DTYPES, has_policy
from te_verify.distributed.types import WrapperError
from te_verify.spec import CaseSpec

# The policy's reduce dtype -> MixedPrecisionPolicy.grad_comm_dtype.
GRAD_COMM_DTYPES = ("fp32", "bf16")


def policy_fields(spec: CaseSpec) -> dict[str, torch.dtype]:
    """MixedPrecisionPolicy's fields for the spec's policy ({} without one: Megatron-FSDP's default, main weights in
    fp32 and everything else in the model's dtype). Refused before Megatron-FSDP is loaded."""
    if not has_policy(spec):
        return {}
    d = spec.dist
    if d.param_dtype != "bf16":
        raise WrapperError(f"dist.param_dtype={d.param_dtype!r}: Megatron-FSDP's policy here is bf16 parameters")
    if d.reduce_dtype not in GRAD_COMM_DTYPES:
        raise WrapperError(f"dist.reduce_dtype={d.reduce_dtype!r}: Megatron-FSDP reduces in fp32 or bf16 "
                           "(grad_comm_dtype); name one")
    return {"main_params_dtype": torch.float32, "main_grads_dtype": torch.float32,
            "grad_comm_dtype": TORCH_DTYPES[d.reduce_dtype]}


def policy_kwargs(spec: CaseSpec) -> dict:
    """fully_shard's `mixed_precision_policy=` for the spec's policy ({} without one)."""
    fields = policy_fields(spec)
    if not fields:
        return {}
    from megatron_fsdp import MixedPrecisionPolicy

    return {"mixed_precision_policy": MixedPrecisionPolicy(**fields)}


def bf16_params(model: nn.Module, spec: CaseSpec) -> nn.Module:
    """The model Megatron-FSDP wraps: under a policy its parameters cast to the param dtype in place (the Parameters
    the lane's slots hold stay the same objects), else the model as it is."""
    if has_policy(spec):
        model.to(TORCH_DTYPES[spec.dist.param_dtype])
    return model


def casts_params_to(spec: CaseSpec) -> torch.dtype | None:
    return TORCH_DTYPES[spec.dist.param_dtype] if has_policy(spec) else None
