"""Megatron-core DDP (0.16.1) under a bf16 policy (DistConfig.param_dtype / reduce_dtype): bf16 parameters, fp32
master weights, main gradients in fp32 or bf16.

As Megatron trains in bf16: the model is wrapped in Megatron's own `Float16Module` (config.bf16), which casts its
parameters to bf16 in place and each input to bf16 (training starts from the fp32 parameters' rounding:
Engine.casts_params_to), then in DistributedDataParallel with `grad_reduce_in_fp32` from the policy's reduce dtype:
"fp32" -> True (an fp32 grad buffer: each bf16 wgrad added into an fp32 `main_grad`, the all-reduce in fp32),
"bf16" -> False (a bf16 grad buffer, reduced in bf16; distributed_data_parallel.py:147). The module's output stays
bf16 (`fp32_output=False`, a Float16Module option), as eager's under torch.autocast.

The step is Megatron's mixed-precision optimizer's (Float16OptimizerWithFloat16Params, optimizer.py:671-699 and
754-779; the distributed one, distrib_optimizer.py:361-435 and 2386): an fp32 master copy of every trainable bf16
parameter (of this rank's shard of every bucket with the distributed optimizer), the master's gradient
`main_grad.float()`, SGD on the masters, the masters copied back into the bf16 parameters (rounded to nearest).
Megatron's classes cannot run on a CPU rank: both accept only `torch.cuda.*Tensor` parameters (a CPU bf16 parameter
raises TypeError, optimizer.py:696, distrib_optimizer.py:432) and make their unit loss scale on device 'cuda'
(optimizer.py:485). So `MasterStep` is that step, written here and confined to these cases; what it does not do
(loss scaling, clipping, fp16) no case asks for.

The lane reads a trainable parameter as its fp32 master and a frozen one (no master) as its bf16 value widened
(deepspeed_bf16.master_value); gradients as the optimizer reads them, `main_grad.float()` (their dtype in the
all-reduce is judged by collective_dtypes).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from te_verify.distributed.policy import has_policy
from te_verify.distributed.types import WrapperError
from te_verify.spec import CaseSpec

# The policy's reduce dtype -> DistributedDataParallelConfig.grad_reduce_in_fp32.
GRAD_REDUCE_IN_FP32 = {"fp32": True, "bf16": False}


def grad_reduce_in_fp32(spec: CaseSpec) -> bool:
    """DDP's grad_reduce_in_fp32 for the spec's policy (False, Megatron's default, without one)."""
    if not has_policy(spec):
        return False
    d = spec.dist
    if d.param_dtype != "bf16":
        raise WrapperError(f"dist.param_dtype={d.param_dtype!r}: Megatron DDP's policy here is bf16 parameters")
    if d.reduce_dtype not in GRAD_REDUCE_IN_FP32:
        raise WrapperError(f"dist.reduce_dtype={d.reduce_dtype!r}: Megatron DDP reduces in fp32 (grad_reduce_in_fp32) "
                           "or bf16; name one")
    if spec.te is not None:
        raise WrapperError(f"te={spec.te.tag}: TE's Linear under Megatron's bf16 policy is not a case here")
    return GRAD_REDUCE_IN_FP32[d.reduce_dtype]


def bf16_module(model: nn.Module, spec: CaseSpec, groups) -> tuple[nn.Module, Callable]:
    """(what DDP wraps, how the lane calls the DDP module on a batch): the model itself without a policy; under one,
    Megatron's Float16Module over it (parameters cast to bf16 in place; its pipeline groups `groups`, size 1)."""
    if not has_policy(spec):
        return model, lambda ddp: ddp
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, bf16=True)
    module = Float16Module(config, model)
    module.pg_collection = groups  # forward asks it whether this is the first/last pipeline stage (yes: size 1)
    return module, lambda ddp: (lambda x: ddp(x, fp32_output=False))


class MasterStep:
    """Megatron's mixed-precision step over (model tensor, its gradient) pairs: a bf16 parameter and its main_grad,
    or, with the distributed optimizer, this rank's bf16 shard of a bucket's parameter buffer and its grad shard."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], optimizer: Callable) -> None:
        self.pairs = pairs
        # optimizer.py:674 / distrib_optimizer.py:399: the master is the bf16 value widened.
        self.masters = [t.detach().clone().float() for t, _ in pairs]
        self.optimizer = optimizer(self.masters)

    def step(self) -> None:
        for master, (_, grad) in zip(self.masters, self.pairs):
            master.grad = grad.float()  # _copy_model_grads_to_main_grads (a copy where main_grad is bf16)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for master, (model, _) in zip(self.masters, self.pairs):
                model.copy_(master)  # _copy_main_params_to_model_params: rounded to the model's bf16

    def master_of(self) -> dict[int, torch.Tensor]:
        """Each model tensor's master by the tensor's id."""
        return {id(t): m for (t, _), m in zip(self.pairs, self.masters)}
