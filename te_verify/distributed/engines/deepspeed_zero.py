"""deepspeed_zero1/2/3: DeepSpeed's ZeRO stages 1, 2 and 3 (`deepspeed.initialize`), 0.19.8, on CPU/gloo.

Options (spec.dist.options): microbatches (gradient accumulation: gradient_accumulation_steps = microbatches,
train_micro_batch_size_per_gpu = a rank's rows per microbatch), and for stage 3 persistence_threshold
(stage3_param_persistence_threshold: a parameter of at most that many elements stays gathered
between steps; 0: none does; absent: DeepSpeed's default, 100,000). Stage 3 prefetches nothing
(stage3_prefetch_bucket_size 0), so what each module gathers shows in the phase that needs it, and keeps nothing
gathered for reuse (stage3_max_reuse_distance 0: DeepSpeed's default, 10^9 elements, keeps a parameter gathered from
forward to backward once its trace is recorded -- from the second microbatch on, the whole of these small models --
so it would reshard after forward in the first microbatch only).

The optimizer is torch SGD (training.sgd) over the trainable parameters, handed to `deepspeed.initialize`, which
wraps it in its ZeRO optimizer (zero_allow_untested_optimizer). DeepSpeed reuses the rank's torch.distributed
default group (deepspeed.comm.init_distributed wraps an initialised one). Backward of a microbatch is
`engine.backward` of sum(out * cotangent), the loss whose gradient is `out.backward(cotangent)`, with
scale_wrt_gas=False: DeepSpeed's default divides the loss by gradient_accumulation_steps, which would divide the
input's gradient too, and the lane reads that one unscaled; the engine's gradients then are the rank-average of
the microbatches' sum (grad_divisor = world size). With microbatches, the accumulation boundary is set per
microbatch (`set_gradient_accumulation_boundary`, DeepSpeed's way to call `engine.step()` once after all
microbatches): the last microbatch's backward reduces, so full gradients are readable before the step.

CPU step (0.19.8 only): DeepSpeed's TorchBackend JIT-compiles a shared-memory all-reduce op with the C++ compiler
at start-up (deepspeed.comm.torch.build_shm_op), used only by inference_all_reduce; on a CPU rank that one
function answers None (no op), as on an accelerator without it. DeepSpeed picks its accelerator once per process,
from torch.cuda when it sees a GPU: a CPU rank sets DS_ACCELERATOR=cpu before DeepSpeed first picks (needed only
on a host whose torch sees a GPU; a no-op here), and refuses to run if another accelerator was picked already.

Not CPU steps, on every device: gradient_clipping 0 (DeepSpeed 0.19.8 clips to norm 1.0 unless told); DeepSpeed's
comm backend calls the all-gather and reduce-scatter it bound at start-up through late look-ups, so the case's
collective counter sees them (late_collectives); ZeRO-3 full parameters are read from the partitions without
GatheredParameters (gathered_value). With recompute "deepspeed" the model's blocks run under DeepSpeed's own
`deepspeed.checkpointing.checkpoint` (its reentrant CheckpointFunction, RNG state through the cpu accelerator). ZeRO-3 replaces torch.nn.functional.linear for the whole process
(memory_efficient_linear); isolation.fresh_case puts torch's back before every case.
"""
from __future__ import annotations

import importlib
import os
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.compat import record
from te_verify.distributed.types import Engine
from te_verify.distributed.engines.deepspeed_bf16 import (cast_inputs, is_bf16_optimizer, master_value,
                                                          precision_config)
from te_verify.distributed.engines.gathered import zero3_gathered
from te_verify.distributed.policy import has_policy
from te_verify.distributed.rank.training import microbatches, te_stack
from te_verify.training import StateBytes, TrainStep, sgd
from te_verify.distributed.types import (Wrapped, WrapperError, options, param_slots, param_tensors, units_of,
                                         value_of)
from te_verify.spec import CaseSpec

CPU_STEP = ("deepspeed-cpu-no-shm-op: deepspeed 0.19.8's TorchBackend JIT-compiles an inference-only shared-memory "
            "all-reduce op (deepspeed.comm.torch.build_shm_op) with the C++ compiler; on a CPU rank that function "
            "returns None (no op), and DS_ACCELERATOR=cpu")
OPTIONS = {1: {"microbatches", "grad_accum_dtype"}, 2: {"microbatches", "grad_accum_dtype"},
           3: {"microbatches", "persistence_threshold", "grad_accum_dtype"}}
# Never reached: DeepSpeed prints its progress line every steps_per_print steps.
QUIET = 10**9


def no_shm_op() -> None:
    """deepspeed.comm.torch.build_shm_op on a CPU rank: no shared-memory op, as where the builder is missing."""
    return None


def cpu_step() -> None:
    if not hasattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op"):
        raise WrapperError("deepspeed: deepspeed.comm.torch.build_shm_op is gone; the CPU step replaces it")
    chosen = os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if chosen != "cpu":
        raise WrapperError(f"DS_ACCELERATOR={chosen}: a CPU rank runs DeepSpeed's cpu accelerator")
    from deepspeed.accelerator import get_accelerator

    # By sys.modules: the attribute `deepspeed.comm.torch` is torch itself (deepspeed.comm imports it by that name).
    ds_torch = importlib.import_module("deepspeed.comm.torch")

    if get_accelerator().device_name() != "cpu":
        raise WrapperError(f"DeepSpeed picked its {get_accelerator().device_name()} accelerator in this process "
                           "before the CPU step: a CPU rank needs the cpu one")
    ds_torch.build_shm_op = no_shm_op
    record(CPU_STEP)


class LateCollective:
    """A torch.distributed collective looked up by name at each call, as the case's collective counter expects. (The
    counter names what a collective carries by reading every parameter by its slot, past ZeRO-3's ZeROOrderedDict:
    carried.registered.)"""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        return getattr(dist, self.name)(*args, **kwargs)


def late_collectives() -> None:
    """DeepSpeed's TorchBackend keeps torch.distributed.all_gather_into_tensor and reduce_scatter_tensor as
    attributes of its instance (comm/torch.py, all_gather_function / reduce_scatter_function), bound when it is
    made: every ZeRO parameter all-gather and stage-3 gradient reduce-scatter goes through them, past the
    counter that patches torch.distributed for a case. Here they look the same functions up at each call."""
    from deepspeed.comm import comm

    for attr in ("all_gather_function", "reduce_scatter_function"):
        bound = getattr(comm.cdb, attr)
        if bound is not None and not isinstance(bound, LateCollective):
            setattr(comm.cdb, attr, LateCollective(bound.__name__))


def gathered_value(p: nn.Parameter) -> torch.Tensor:
    """A ZeRO-3 parameter's full value, from every rank's partition of it (`ds_tensor`, which the step updates) by a
    plain all-gather (a collective): unlike GatheredParameters, whose exit partitions again even the persistent
    parameters ZeRO-3 keeps gathered (the next forward would gather them once more), it leaves the engine as it is."""
    parts = [torch.empty_like(p.ds_tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, p.ds_tensor.detach())
    return torch.cat(parts)[:p.ds_numel].view(p.ds_shape)


def config(stage: int, spec: CaseSpec, opts: dict) -> dict:
    """The DeepSpeed config: the global batch over ranks and microbatches, ZeRO `stage`, fp32 throughout, no
    gradient clipping (DeepSpeed 0.19.8 clips to norm 1.0 by default; the eager SGD it is judged against does not)."""
    world, chunks = dist.get_world_size(), microbatches(spec)
    rows = spec.batch_shape[0] // world
    if rows % chunks:
        raise WrapperError(f"microbatches={chunks}: a rank's {rows} rows do not split evenly")
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = zero["stage3_max_reuse_distance"] = 0
        if "persistence_threshold" in opts:
            zero["stage3_param_persistence_threshold"] = int(opts["persistence_threshold"])
    return {"train_batch_size": rows * world, "train_micro_batch_size_per_gpu": rows // chunks,
            "gradient_accumulation_steps": chunks, "zero_optimization": zero, "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0, "steps_per_print": QUIET, "wall_clock_breakdown": False,
            **precision_config(spec, opts)}


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def wrap(stage: int, model: nn.Module, spec: CaseSpec) -> Wrapped:
    opts = options(spec)
    unknown = set(opts) - OPTIONS[stage]
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: deepspeed_zero{stage} takes {sorted(OPTIONS[stage])}")
    if run_device.active().type == "cpu":
        cpu_step()
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

    if spec.recompute == "deepspeed":  # DeepSpeed's own activation checkpointing around the model's blocks
        model.checkpoint = deepspeed.checkpointing.checkpoint
    slots = param_slots(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    in_optimizer = {id(p) for p in trainable}
    chunks = microbatches(spec)
    inner = te_stack(model, spec) if spec.te is not None else model  # TE's Linear holding the same Parameters
    layers = list(inner) if spec.te is not None else units_of(model, spec)  # the modules the engine runs
    engine, *_ = deepspeed.initialize(model=inner, optimizer=sgd(trainable), config=config(stage, spec, opts))
    late_collectives()
    zero = engine.optimizer  # DeepSpeed's ZeRO optimizer; the torch SGD it steps is zero.optimizer
    seen = [0]  # microbatches backpropagated in this iteration

    def backward(out: torch.Tensor, cotangent: torch.Tensor) -> None:
        if chunks > 1:
            engine.set_gradient_accumulation_boundary(seen[0] == chunks - 1)
        seen[0] = (seen[0] + 1) % chunks
        engine.backward((out * cotangent).sum(), scale_wrt_gas=False)

    def grad(p: nn.Parameter) -> torch.Tensor | None:
        """A trainable parameter's full gradient (a collective); a frozen one's .grad, which must be None."""
        return safe_get_full_grad(p) if id(p) in in_optimizer else p.grad

    def full_params() -> dict:
        if has_policy(spec):  # the fp32 masters the step updates (the model holds their bf16 rounding)
            return param_tensors(slots, master_value(safe_get_full_fp32_param,
                                                     value_of if stage < 3 else gathered_value))
        return param_tensors(slots, value_of if stage < 3 else gathered_value)

    def state() -> dict[str, StateBytes]:
        moments = nbytes(t for s in zero.optimizer.state.values() for t in s.values())
        if is_bf16_optimizer(zero):
            return bf16_optimizer_state(zero, moments)
        if stage < 3:
            master = nbytes(zero.single_partition_of_fp32_groups)
            # Gradient partitions kept across steps: stage 1's averaged_gradients, stage 2's grads_in_partition
            # (both released by the step). The IPG buckets are reduce_bucket_size staging buffers, a fixed size
            # whatever is frozen, and are not counted.
            grads = nbytes(g for group in zero.averaged_gradients.values() if group is not None
                           for g in (group if isinstance(group, list) else [group])) \
                if isinstance(zero.averaged_gradients, dict) else 0
            grads += nbytes([getattr(zero, "grads_in_partition", None)])
            # Each group's flat buffer is padded to a multiple of 2 x world elements (nccl_start_alignment_factor)
            # and split evenly: a rank's partition exceeds its exact share by under 2 elements per group.
            slack = 2 * 4 * len(zero.bit16_groups)
        else:
            master = nbytes(zero.fp32_partitioned_groups_flat)
            # ZeRO-3's flat gradient partition of the parameters it optimises, kept across steps.
            grads = nbytes([zero.grad_partitions_flat_buffer])
            # Each parameter is padded to a multiple of the world size and split evenly: a rank's partition
            # exceeds its exact share by under 1 element per trainable parameter.
            slack = 4 * len(trainable)
        return {"optimizer_state": StateBytes(moments, True, slack=slack),
                "master": StateBytes(master, True, slack=slack),
                "grad_buffer": StateBytes(grads, True, slack=slack)}

    train = TrainStep(backward=backward, finish=lambda: None, step=engine.step, state=state)
    return Wrapped(cast_inputs(engine, spec), layers, lambda: param_tensors(slots, grad), full_params,
                   zero3_gathered(layers) if stage == 3 else None, dist.get_world_size(), keep=[engine], train=train)


def bf16_optimizer_state(zero, moments: int) -> dict[str, StateBytes]:
    """ZeRO-1's BF16_Optimizer (bf16 with grad_accum_dtype fp32): fp32 master partitions (sharded), and a full fp32
    gradient accumulation buffer per rank (fp32_groups_gradients_flat: every rank accumulates and all-reduces the
    whole gradient, ZeRO-1 shards no gradient). Groups are padded as stage 1's (2 x world elements)."""
    slack = 2 * 4 * dist.get_world_size() * len(zero.bf16_groups)
    return {"optimizer_state": StateBytes(moments, True, slack=slack),
            "master": StateBytes(nbytes(zero.fp32_groups_flat_partition), True, slack=slack),
            "grad_buffer": StateBytes(nbytes(zero.fp32_groups_gradients_flat), False, slack=slack)}


def engine_of(stage: int) -> Engine:
    return Engine(f"deepspeed_zero{stage}", partial(wrap, stage), shards=lambda spec: stage == 3,
                  reshards_after_forward=lambda spec: stage == 3, cpu_steps=(CPU_STEP,), package="deepspeed",
                  reductions=lambda spec: microbatches(spec) if stage >= 2 else 1,
                  casts_params_to=lambda spec: torch.bfloat16 if has_policy(spec) else None)


ENGINE_ZERO1, ENGINE_ZERO2, ENGINE_ZERO3 = (engine_of(stage) for stage in (1, 2, 3))
ENGINES = (ENGINE_ZERO1, ENGINE_ZERO2, ENGINE_ZERO3)
