"""DeepSpeed's `bf16` section as a case's mixed-precision policy (DistConfig.param_dtype / reduce_dtype), 0.19.8.

param_dtype "bf16": `bf16.enabled` -- DeepSpeed casts the model's parameters to bf16 in place (the forward and
backward compute in bf16) and keeps fp32 master weights in its optimizer, which the SGD step updates and copies back
rounded. reduce_dtype: `communication_data_type`, the dtype its gradient reductions carry (DeepSpeed's default with
bf16 enabled is bf16, even where gradients accumulate in fp32: engine.communication_data_type). The option
grad_accum_dtype "fp32" sets `data_types.grad_accum_dtype` (absent: DeepSpeed's default, the model's dtype); with
ZeRO-1 it selects DeepSpeed's BF16_Optimizer (engine._do_optimizer_sanity_check), the optimizer of
deepspeedai/DeepSpeed#7985.

DeepSpeed does not cast a bf16 model's inputs (its `auto_cast` is fp16's): a user casts the batch, as `module` does
here, so the input's gradient flows back to the fp32 input through that cast, as under torch.autocast. The
parameters the lane reads are the fp32 masters (what a checkpoint saves); a frozen parameter has none and is read as
the bf16 value DeepSpeed left in the model, widened.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from te_verify.distributed.policy import TORCH_DTYPES, has_policy
from te_verify.distributed.types import WrapperError
from te_verify.spec import CaseSpec

GRAD_ACCUM_DTYPES = ("fp32",)


def precision_config(spec: CaseSpec, opts: dict) -> dict:
    """The config's bf16 section, communication dtype and gradient accumulation dtype from the spec's policy."""
    accum = opts.get("grad_accum_dtype")
    if accum is not None and accum not in GRAD_ACCUM_DTYPES:
        raise WrapperError(f"dist.options grad_accum_dtype={accum!r}: expected one of {GRAD_ACCUM_DTYPES}")
    if not has_policy(spec):
        if accum is not None:
            raise WrapperError("dist.options grad_accum_dtype: only with a bf16 policy (dist.param_dtype='bf16')")
        return {}
    if spec.dist.param_dtype != "bf16":
        raise WrapperError(f"dist.param_dtype={spec.dist.param_dtype!r}: DeepSpeed's policy here is its bf16 section")
    out: dict = {"bf16": {"enabled": True}}
    if spec.dist.reduce_dtype:
        out["communication_data_type"] = spec.dist.reduce_dtype
    if accum is not None:
        out["data_types"] = {"grad_accum_dtype": accum}
    return out


def cast_inputs(engine: nn.Module, spec: CaseSpec) -> Callable[[torch.Tensor], torch.Tensor]:
    """The engine called on the batch in the policy's param dtype (a user's `batch.to(torch.bfloat16)`)."""
    if not has_policy(spec):
        return engine
    dtype = TORCH_DTYPES[spec.dist.param_dtype]
    return lambda x: engine(x.to(dtype))


def master_value(read_full: Callable[[nn.Parameter], torch.Tensor | None],
                 model_value: Callable[[nn.Parameter], torch.Tensor]) -> Callable[[nn.Parameter], torch.Tensor]:
    """A parameter's value as the lane reads it under a policy: its fp32 master (`read_full`, DeepSpeed's
    safe_get_full_fp32_param), else (frozen, no master) the model's bf16 value (`model_value`: ZeRO-3 gathers its
    partitions) widened to fp32."""
    def read(p: nn.Parameter) -> torch.Tensor:
        master = read_full(p) if p.requires_grad else None
        return master if master is not None else model_value(p).float()
    return read


def is_bf16_optimizer(zero) -> bool:
    return type(zero).__name__ == "BF16_Optimizer"

