"""megatron_ddp: megatron-core's DistributedDataParallel (contiguous grad buffers, `main_grad`), 0.16.1 on CPU/gloo.

Options (spec.dist.options): overlap_grad_reduce (dispatch each bucket's all-reduce from backward hooks; from the
second iteration on, the first records the order), bucket_size (elements per bucket; None: one bucket), microbatches
(gradient accumulation under no_sync). gloo has no PREMUL_SUM, so gradient_reduce_div_fusion is off (a config
choice, not a patch). A case with `spec.te` runs TE's Linear (its real Python over the active --te-impl) with
`fuse_wgrad_accumulation`: TE adds the wgrad into the `main_grad` DDP gives each trainable weight and returns a
dummy wgrad that DDP must ignore (`grad_added_to_main_grad`).

The optimizer is torch SGD over `main_grad`, as Megatron's FP32Optimizer steps it (it sets `param.grad =
param.main_grad`); Megatron's own optimizer classes are not used: the distributed optimizer accepts only
torch.cuda.*Tensor parameters (megatron/core/optimizer/distrib_optimizer.py:420).

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
from te_verify.compat.cuda_stand_in import confine
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


def wrap(model: nn.Module, spec: CaseSpec) -> Wrapped:
    opts = options(spec)
    unknown = set(opts) - OPTIONS
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: megatron_ddp takes {sorted(OPTIONS)}")
    load_te()
    if run_device.active().type == "cpu":
        cpu_step()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    slots, layers = param_slots(model), units_of(model, spec)
    inner = te_stack(model, spec) if spec.te is not None else model
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=bool(opts.get("overlap_grad_reduce", False)),
                                               use_distributed_optimizer=bool(opts.get("use_distributed_optimizer")),
                                               bucket_size=opts.get("bucket_size"), gradient_reduce_div_fusion=False)
    ddp = DistributedDataParallel(config, ddp_config, inner, pg_collection=process_groups())
    distributed = ddp_config.use_distributed_optimizer
    trainable = [p for p in inner.parameters() if p.requires_grad]
    shards = bucket_shards(ddp) if distributed else []
    optimizer = sgd([param for param, _ in shards] if distributed else trainable)

    def step() -> None:
        if distributed:  # this rank's shard of every bucket, then DDP's all-gather of the parameter buffer
            for param, grad in shards:
                param.grad = grad
        else:
            for p in trainable:  # Megatron's FP32Optimizer.prepare_grads
                p.grad = p.main_grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if distributed:
            ddp.start_param_sync(force_sync=True)
        ddp.zero_grad_buffer()

    def state() -> dict[str, StateBytes]:
        held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor))
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers)
        pad = padding_bound(ddp, len(trainable)) if distributed else 0
        return {"optimizer_state": StateBytes(held, distributed, slack=pad), "master": StateBytes(0, distributed),
                "grad_buffer": StateBytes(grads, False, slack=pad)}

    ddp.zero_grad_buffer()
    train = TrainStep(backward=default_backward, finish=ddp.finish_grad_sync, step=step, state=state,
                      no_sync=ddp.no_sync)
    grads = (lambda: gathered_main_grads(ddp, slots)) if distributed else (lambda: param_tensors(slots, main_grad_of))
    return Wrapped(ddp, layers, grads, lambda: param_tensors(slots, value_of), None, dist.get_world_size(),
                   keep=[optimizer], train=train)


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


def gathered_main_grads(ddp, slots) -> dict[str, torch.Tensor | None]:
    """With the distributed optimizer each rank holds the reduced gradient of its shard of every bucket: the full
    gradients are every rank's shards gathered (an observation after the step's collectives are counted)."""
    world = dist.get_world_size()
    full = {}
    for buffer in ddp.buffers:
        data = buffer.grad_data.clone()
        for bucket in buffer.buckets:
            n = bucket.grad_data.numel() // world
            mine = bucket.grad_data.view(-1)[dist.get_rank() * n:(dist.get_rank() + 1) * n].clone()
            parts = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(parts, mine)
            data[bucket.offset:bucket.offset + n * world] = torch.cat(parts)
        for param, (start, end, _) in buffer.param_index_map.items():
            full[id(param)] = data[start:end].view(param.shape)
    return {name: full.get(id(getattr(module, attr)), getattr(module, attr).grad) for name, module, attr in slots}


def main_grad_of(p: nn.Parameter) -> torch.Tensor | None:
    """The gradient Megatron keeps: `main_grad` where DDP gave the parameter room in its buffer, else `.grad` (a
    frozen parameter must have neither)."""
    main = getattr(p, "main_grad", None)
    return main if main is not None else p.grad


ENGINE = Engine("megatron_ddp", wrap, shards=lambda spec: False, reshards_after_forward=lambda spec: False,
                cpu_steps=(CPU_STEP,), package="megatron.core")
