"""megatron_ddp: megatron-core's DistributedDataParallel (contiguous grad buffers, `main_grad`), 0.16.1 on CPU/gloo.

Options (spec.dist.options): overlap_grad_reduce (dispatch each bucket's all-reduce from backward hooks; from the
second iteration on, the first records the order), bucket_size (elements per bucket; None: one bucket), microbatches
(gradient accumulation under no_sync). gloo has no PREMUL_SUM, so gradient_reduce_div_fusion is off (a config
choice, not a patch). A case with `spec.te` runs TE's Linear (its real Python over the active --te-impl) with
`fuse_wgrad_accumulation`: TE adds the wgrad into the `main_grad` DDP gives each trainable weight and returns a
dummy wgrad that DDP must ignore (`grad_added_to_main_grad`).

The optimizer is torch SGD over `main_grad`, as Megatron's FP32Optimizer steps it (it sets `param.grad =
param.main_grad`); Megatron's own optimizer classes are not used: the distributed optimizer accepts only
torch.cuda.*Tensor parameters (megatron/core/optimizer/distrib_optimizer.py:420). Under a bf16 policy
(DistConfig.param_dtype / reduce_dtype) the model runs in Megatron's Float16Module and the step is Megatron's
mixed-precision one over fp32 masters (engines.megatron_bf16). With recompute "megatron" the model's blocks run under
Megatron-core's own `tensor_parallel.checkpoint`.

CPU step (0.16.1 only): `megatron.core.distributed.param_and_grad_buffer` allocates the grad buffer with
`device=torch.cuda.current_device()`; in that module alone `torch.cuda` answers current_device with "cpu", and
any other torch.cuda call raises (compat.cuda_stand_in).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.compat import megatron_checkpoint_cpu
from te_verify.compat.cuda_stand_in import confine
from te_verify.distributed.engines.deepspeed_bf16 import master_value
from te_verify.distributed.engines.megatron_bf16 import MasterStep, bf16_module, grad_reduce_in_fp32
from te_verify.distributed.policy import has_policy
from te_verify.distributed.types import Engine
from te_verify.distributed.rank.training import load_te, te_stack
from te_verify.training import StateBytes
from te_verify.training import TrainStep, default_backward, sgd
from te_verify.distributed.types import (Wrapped, WrapperError, options, param_slots, param_tensors, units_of,
                                         value_of)
from te_verify.spec import CaseSpec

CPU_STEP = ("megatron-core-cpu-device: megatron-core 0.16.1 DDP allocates its grad buffer on "
            "torch.cuda.current_device(); in megatron.core.distributed.param_and_grad_buffer only, that answers "
            "'cpu' (any other torch.cuda call raises)")
OPTIONS = {"overlap_grad_reduce", "bucket_size", "use_distributed_optimizer", "microbatches"}


def cpu_step() -> None:
    confine("megatron.core.distributed.param_and_grad_buffer", ("current_device",), CPU_STEP)


@functools.lru_cache(maxsize=None)
def process_groups():
    """Data-parallel = the world; size-1 tensor/pipeline/expert groups (created once per rank process: a
    collective every rank makes at its first Megatron case)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    single = lambda: dist.new_subgroups(group_size=1)[0]
    return ProcessGroupCollection(dp=dist.group.WORLD, tp=single(), pp=single(), ep=single(), expt_dp=single())


def megatron_checkpoint():
    """Megatron-core's own activation checkpoint (tensor_parallel.checkpoint: its reentrant CheckpointFunction,
    activations kept whole), as checkpoint(block, x); on a CPU rank through compat.megatron_checkpoint_cpu."""
    if run_device.active().type == "cpu":
        megatron_checkpoint_cpu.apply()
    from megatron.core import tensor_parallel

    return lambda block, x: tensor_parallel.checkpoint(block, False, x)


def wrap(model: nn.Module, spec: CaseSpec) -> Wrapped:
    opts = options(spec)
    unknown = set(opts) - OPTIONS
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: megatron_ddp takes {sorted(OPTIONS)}")
    reduce_in_fp32 = grad_reduce_in_fp32(spec)  # the policy refused here, before Megatron is loaded
    load_te()
    if run_device.active().type == "cpu":
        cpu_step()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    if spec.recompute == "megatron":
        model.checkpoint = megatron_checkpoint()
    slots, layers, groups = param_slots(model), units_of(model, spec), process_groups()
    inner, call = bf16_module(te_stack(model, spec) if spec.te is not None else model, spec, groups)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=bool(opts.get("overlap_grad_reduce", False)),
                                               use_distributed_optimizer=bool(opts.get("use_distributed_optimizer")),
                                               bucket_size=opts.get("bucket_size"), gradient_reduce_div_fusion=False,
                                               grad_reduce_in_fp32=reduce_in_fp32)
    ddp = DistributedDataParallel(config, ddp_config, inner, pg_collection=groups)
    distributed = ddp_config.use_distributed_optimizer
    trainable = [p for p in inner.parameters() if p.requires_grad]
    # What the optimizer steps: every trainable parameter on its main_grad, or this rank's shard of every bucket.
    pairs = bucket_shards(ddp) if distributed else [(p, p.main_grad) for p in trainable]
    masters = MasterStep(pairs, sgd) if has_policy(spec) else None  # Megatron's mixed-precision step
    optimizer = masters.optimizer if masters is not None else sgd([t for t, _ in pairs])

    def step() -> None:
        if masters is not None:
            masters.step()
        else:  # Megatron's FP32Optimizer.prepare_grads (param.grad = param.main_grad); the distributed one's shards
            for tensor, grad in pairs:
                tensor.grad = grad
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if distributed:  # DDP's all-gather of the parameter buffer from every rank's stepped shard
            ddp.start_param_sync(force_sync=True)
        ddp.zero_grad_buffer()

    def state() -> dict[str, StateBytes]:
        held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor))
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers)
        master = sum(m.numel() * m.element_size() for m in masters.masters) if masters is not None else 0
        pad = padding_bound(ddp, len(trainable)) if distributed else 0
        return {"optimizer_state": StateBytes(held, distributed, slack=pad),
                "master": StateBytes(master, distributed, slack=pad), "grad_buffer": StateBytes(grads, False, slack=pad)}

    ddp.zero_grad_buffer()
    train = TrainStep(backward=default_backward, finish=ddp.finish_grad_sync, step=step, state=state,
                      no_sync=ddp.no_sync)
    return Wrapped(call(ddp), layers, lambda: read_grads(ddp, slots, distributed, masters is not None),
                   lambda: read_params(ddp, slots, distributed, masters), None, dist.get_world_size(),
                   keep=[optimizer], train=train)


def read_grads(ddp, slots, distributed: bool, widen: bool) -> dict[str, torch.Tensor | None]:
    """Every parameter's main_grad (gathered from the ranks' shards with the distributed optimizer); `widen`: as
    Megatron's mixed-precision optimizer reads it, `.float()` (optimizer.py:759)."""
    if distributed:
        full = gathered(ddp, [g for _, g in bucket_shards(ddp)])
        grads = param_tensors(slots, lambda p: full.get(id(p), p.grad))
    else:
        grads = param_tensors(slots, main_grad_of)
    return {name: g.float() if widen and g is not None else g for name, g in grads.items()}


def read_params(ddp, slots, distributed: bool, masters: MasterStep | None) -> dict[str, torch.Tensor | None]:
    """Every parameter's value; under a policy a trainable one's fp32 master (gathered from the ranks' master shards
    with the distributed optimizer), a frozen one's bf16 value widened."""
    if masters is None:
        return param_tensors(slots, value_of)
    if distributed:
        full = gathered(ddp, masters.masters)
        return param_tensors(slots, master_value(lambda p: full.get(id(p)), value_of))
    by_id = masters.master_of()
    return param_tensors(slots, master_value(lambda p: by_id.get(id(p)), value_of))


def bucket_shards(ddp) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter shard, gradient shard) of this rank in every bucket: what the distributed optimizer steps. Its
    shard of the parameter buffer is a view DDP all-gathers after the step (start_param_sync)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for buffer in ddp.buffers:
        for bucket in buffer.buckets:
            n = bucket.grad_data.numel() // world
            out.append((bucket.param_data.view(-1)[rank * n:(rank + 1) * n],
                        bucket.grad_data.view(-1)[rank * n:(rank + 1) * n]))
    return out


def padding_bound(ddp, trainable: int) -> int:
    """Bytes the distributed optimizer's layout may add: each parameter starts 64-element aligned and each bucket
    ends on a multiple of lcm(world, 128) elements (param_and_grad_buffer._pad_start_of_param_if_needed,
    _pad_end_of_bucket_if_needed), in fp32."""
    buckets = sum(len(b.buckets) for b in ddp.buffers)
    return (63 * trainable + (math.lcm(dist.get_world_size(), 128) - 1) * buckets) * 4


def gathered(ddp, shards: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Full per-parameter tensors (by parameter id) from every rank's shard of every bucket, `shards` in
    bucket_shards' order: its gradient shards, or its fp32 master shards. With the distributed optimizer each rank
    holds only its shard of the reduced gradients and steps only its shard of the parameters (a collective: an
    observation after the step's collectives are counted)."""
    world, rank, full = dist.get_world_size(), dist.get_rank(), {}
    mine = iter(shards)
    for buffer in ddp.buffers:
        local = [next(mine) for _ in buffer.buckets]
        data = torch.zeros(buffer.grad_data.numel(), dtype=local[0].dtype)
        for bucket, shard in zip(buffer.buckets, local):
            n = bucket.grad_data.numel() // world
            parts = [torch.empty_like(shard) for _ in range(world)]
            dist.all_gather(parts, shard.detach().clone())
            data[bucket.offset:bucket.offset + n * world] = torch.cat(parts)
        for param, (start, end, _) in buffer.param_index_map.items():
            full[id(param)] = data[start:end].view(param.shape)
    return full


def main_grad_of(p: nn.Parameter) -> torch.Tensor | None:
    """The gradient Megatron keeps: `main_grad` where DDP gave the parameter room in its buffer, else `.grad` (a
    frozen parameter must have neither)."""
    main = getattr(p, "main_grad", None)
    return main if main is not None else p.grad


ENGINE = Engine("megatron_ddp", wrap, shards=lambda spec: False, reshards_after_forward=lambda spec: False,
                cpu_steps=(CPU_STEP,), package="megatron.core",
                casts_params_to=lambda spec: torch.bfloat16 if has_policy(spec) else None)  # Float16Module
