"""megatron_fsdp: Megatron-FSDP (`megatron_fsdp.fully_shard`, the megatron-fsdp package), 0.6.1 on CPU/gloo.

Options (spec.dist.options): zero_dp_strategy (no_shard | optim | optim_grads | optim_grads_params: what is
sharded over the data-parallel ranks, ZeRO 0-3; default Megatron-FSDP's, optim_grads_params), overlap
(overlap_grad_reduce and overlap_param_gather together; default Megatron-FSDP's, True), sync_model_each_microbatch
(Megatron-FSDP's model auto-sync: gradients reduced and finish_grad_sync run after every backward; default
Megatron-FSDP's, True), microbatches (gradient accumulation under the model's no_sync). The mesh is (world, 1)
named ("fsdp", "tp") on CPU, one FSDP unit per nn.Linear. gloo has no PREMUL_SUM, so the wrapped model's
gradient_reduce_div_fusion is turned off after wrapping (a config choice, not a patch: it falls back to mul_ then
SUM). Megatron-FSDP averages gradients over the data-parallel ranks (gradient_scaling_factor 1 / world).
Under a bf16 policy (DistConfig.param_dtype / reduce_dtype) the model is bf16 with fp32 main weights and grads and
reductions in the reduce dtype: engines.megatron_fsdp_bf16 (its MixedPrecisionPolicy).

The training iteration is the library's documented one: `fully_shard(module, optimizer)` replaces the
optimizer's parameters with Megatron-FSDP's distributed parameters (DTensors over its main-weight buffers, every
parameter, frozen ones included) and wraps `optimizer.step` (the base step, then `install_optimized_model_weights`:
main weights copied into the model's compute weights) and `optimizer.zero_grad` (then `zero_grad_buffer`); forward,
backward (with model auto-sync, its post-backward hook finishes the gradient sync; without, `finish_grad_sync()`,
which the wrapped step would otherwise run), `optimizer.step()`, `optimizer.zero_grad()`. The optimizer is training.sgd; fully_shard_optimizer initialises its
state eagerly (a step with zero gradients on every parameter it holds).

Its own config (any device, 0.6.1 only): fully_shard imports megatron-core's DistributedDataParallelConfig
wherever megatron-core is installed (fully_shard.py:30-37, its own copy only on ImportError), and megatron-core
0.16.1's (installed for megatron_ddp) lacks fields 0.6.1 passes (`fsdp_db_use_persist_buf_on_alloc_fail`, the
`megatron_fsdp_*` ones): TypeError at wrap. In megatron_fsdp.fully_shard alone the name is bound to the package's
own class (megatron_fsdp.distributed_data_parallel_config), the one it uses without megatron-core (CONFIG_STEP).

CPU step (0.6.1 only), each touch point confined to its module (compat.cuda_stand_in; any other torch.cuda call
there raises):
- megatron_fsdp.megatron_fsdp: MegatronFSDP.__init__ formats `torch.cuda.current_device()` into "cuda:{}" to
  compare with the `device` argument and log a mismatch warning (lines 234/238), and makes two side streams with
  `torch.cuda.Stream()` (406/407). There current_device answers the index 0 (the stand-in's "cpu" would make the
  invalid device string "cuda:cpu"; the comparison only decides whether to log), Stream a stream CPU program order
  already gives.
- megatron_fsdp.param_and_grad_buffer: `current_stream()` / `stream()` around reduce-scatter and all-gather
  dispatch (4029/4031/4037, 4533/4558/4560), `empty_cache()` after buffer set-up (3119).
- megatron_fsdp.uneven_dtensor: validate_uneven_dtensor (run for every distributed parameter at wrap,
  `make_fsdp_dtensor(run_check=True)`) builds its boundary-check tensor with `torch.tensor(...).cuda()` (187) to
  all-reduce it; in that module alone `torch.tensor` makes a host tensor whose `.cuda()` is itself (gloo reduces
  host tensors), its only torch.tensor call, and torch.cuda has no member.
"""
from __future__ import annotations

import functools
import math
import types

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.compat import record
from te_verify.compat.cuda_stand_in import confine
from te_verify.distributed.types import Engine
from te_verify.distributed.engines.deepspeed_bf16 import cast_inputs
from te_verify.distributed.engines.gathered import megatron_fsdp_gathered
from te_verify.distributed.engines.megatron_fsdp_bf16 import bf16_params, casts_params_to, policy_kwargs
from te_verify.distributed.engines.layout import megatron_fsdp_layout
from te_verify.distributed.rank.training import load_te, microbatches
from te_verify.training import StateBytes
from te_verify.training import TrainStep, default_backward, sgd
from te_verify.distributed.types import Wrapped, WrapperError, options, param_slots, units_of
from te_verify.spec import CaseSpec

CPU_STEP = ("megatron-fsdp-cpu-device: megatron-fsdp 0.6.1 on CPU; confined per module, any other torch.cuda call "
            "raises: megatron_fsdp.megatron_fsdp current_device (answers index 0, only formatted into 'cuda:{}' for "
            "a device-mismatch warning) and Stream (CPU program order); megatron_fsdp.param_and_grad_buffer "
            "current_stream, stream and empty_cache; megatron_fsdp.uneven_dtensor's boundary-check "
            "torch.tensor(...).cuda() stays a host tensor")
SYNC_STEP = ("megatron-fsdp-cpu-synchronous-collectives: megatron-fsdp 0.6.1 on CPU; in "
             "megatron_fsdp.param_and_grad_buffer every all-gather, reduce-scatter and all-reduce (coalesced or not) "
             "finishes before it returns: Megatron-FSDP frees and reuses its buckets where a CUDA stream would order "
             "it after the collective, and gloo writes them from its own thread (the heap of a rank was corrupted)")
ASYNC_COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast")
CONFIG_STEP = ("megatron-fsdp-own-config: megatron-fsdp 0.6.1's fully_shard builds its DistributedDataParallelConfig "
               "from its own megatron_fsdp.distributed_data_parallel_config, not the installed megatron-core's (0.16.1 "
               "lacks fields 0.6.1 passes)")
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
DEFAULT_STRATEGY = "optim_grads_params"  # fully_shard's zero_dp_strategy=3
# Strategies that keep only a rank's partition of the gradients: "for grads shard mode there will actually always be
# gradient sync happening" (MegatronFSDP.no_sync's docstring), one reduce-scatter per microbatch.
GRADS_SHARDED = ("optim_grads", "optim_grads_params")
OPTIONS = {"zero_dp_strategy", "overlap", "sync_model_each_microbatch", "microbatches"}


def own_config() -> None:
    """megatron_fsdp.fully_shard's DistributedDataParallelConfig: the package's own (CONFIG_STEP)."""
    import importlib

    entry = importlib.import_module("megatron_fsdp.fully_shard")
    own = importlib.import_module("megatron_fsdp.distributed_data_parallel_config").DistributedDataParallelConfig
    if entry.DistributedDataParallelConfig is not own:
        entry.DistributedDataParallelConfig = own
    record(CONFIG_STEP)


def cpu_step() -> None:
    # current_device is formatted into "cuda:{}" there (see the module docstring): it answers the index 0.
    confine("megatron_fsdp.megatron_fsdp", ("Stream",), CPU_STEP, answers={"current_device": lambda: 0})
    buffers = confine("megatron_fsdp.param_and_grad_buffer", ("current_stream", "stream", "empty_cache"), CPU_STEP)
    synchronous_collectives(buffers)
    uneven = confine("megatron_fsdp.uneven_dtensor", (), CPU_STEP)
    uneven.torch.tensor = host_tensor


class CompletedWork:
    """The handle of a collective that already finished (SYNC_STEP)."""

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class SynchronousDistributed(types.ModuleType):
    """torch.distributed for megatron_fsdp.param_and_grad_buffer: its collectives finish before they return."""

    def __init__(self) -> None:
        super().__init__("torch.distributed")

    def __getattr__(self, name: str):
        value = getattr(dist, name)  # looked up at call time: te_verify's collective counter patches dist
        if name not in ASYNC_COLLECTIVES:
            return value

        def synchronous(*args, async_op: bool = False, **kwargs):
            value(*args, async_op=False, **kwargs)
            return CompletedWork() if async_op else None

        return synchronous


def synchronous_collectives(module: types.ModuleType) -> None:
    """SYNC_STEP in `module` (confined by cuda_stand_in.confine, so its `torch` is a per-module proxy)."""
    module.torch.distributed = SynchronousDistributed()
    coalescing = dist._coalescing_manager
    module._coalescing_manager = lambda group=None, device=None, async_ops=False: coalescing(group, device)
    record(SYNC_STEP)


def host_tensor(*args, **kwargs) -> torch.Tensor:
    """torch.tensor for megatron_fsdp.uneven_dtensor: a host tensor that `.cuda()` leaves where it is."""
    t = torch.tensor(*args, **kwargs)
    t.cuda = lambda *a, **k: t
    return t


@functools.lru_cache(maxsize=None)
def mesh(world: int):
    """The (fsdp, tp) = (world, 1) CPU mesh, made once per rank process (its groups are collectives every rank
    makes, and a mesh per case would leave process groups behind)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world, 1), mesh_dim_names=("fsdp", "tp"))


def settings(spec: CaseSpec) -> dict:
    """fully_shard's keyword arguments from spec.dist.options (Megatron-FSDP's defaults where one is absent)."""
    opts = options(spec)
    unknown = set(opts) - OPTIONS
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: megatron_fsdp takes {sorted(OPTIONS)}")
    strategy = opts.get("zero_dp_strategy", DEFAULT_STRATEGY)
    if strategy not in STRATEGIES:
        raise WrapperError(f"zero_dp_strategy={strategy!r}: megatron_fsdp takes {'|'.join(STRATEGIES)}")
    kwargs = {"zero_dp_strategy": strategy}
    if "overlap" in opts:
        kwargs["overlap_grad_reduce"] = kwargs["overlap_param_gather"] = bool(opts["overlap"])
    if "sync_model_each_microbatch" in opts:
        kwargs["sync_model_each_microbatch"] = bool(opts["sync_model_each_microbatch"])
    return kwargs


def reduces_each_microbatch(spec: CaseSpec) -> bool:
    """By design: a gradient-sharding strategy always does (GRADS_SHARDED), and model auto-sync
    (sync_model_each_microbatch, fully_shard's default) synchronises "EVERY training step"
    (MegatronFSDP.set_model_auto_sync's docstring)."""
    return strategy_of(spec) in GRADS_SHARDED or dict(spec.dist.options).get("sync_model_each_microbatch", True)


def strategy_of(spec: CaseSpec) -> str:
    return dict(spec.dist.options).get("zero_dp_strategy", DEFAULT_STRATEGY)


def wrap(model: nn.Module, spec: CaseSpec) -> Wrapped:
    kwargs = settings(spec)
    if spec.model is not None or spec.te is not None:
        raise WrapperError("megatron_fsdp wraps plain linear stacks only (no model family, no TE modules)")
    load_te()
    kwargs.update(policy_kwargs(spec))  # a bf16 policy (engines.megatron_fsdp_bf16)
    own_config()
    if run_device.active().type == "cpu":
        cpu_step()
    from megatron_fsdp import fully_shard

    world = dist.get_world_size()
    model = bf16_params(model, spec)  # under a policy, bf16 in place: the same Parameters
    slots, layers = param_slots(model), units_of(model, spec)
    optimizer = sgd(model.parameters())  # fully_shard swaps in its distributed parameters
    fsdp, optimizer = fully_shard(model, optimizer, device_mesh=mesh(world), dp_shard_dim="fsdp", tp_dim="tp",
                                  fsdp_unit_modules=[nn.Linear], device=run_device.active(),
                                  preproc_state_dict_for_dcp_ckpt=False, **kwargs)
    fsdp.ddp_config.gradient_reduce_div_fusion = False  # gloo has no PREMUL_SUM
    buffers = fsdp.param_and_grad_buffer
    strategy = kwargs["zero_dp_strategy"]

    def finish() -> None:
        """Gradients reduced before they are read, once: with model auto-sync (sync_model_each_microbatch) the
        post-backward hook has done it; without, optimizer.step() would (fully_shard.py:531), so it runs here and the
        step is told it ran (sync_grad_before_optimizer_step=False, the wrapped step's documented keyword)."""
        if not fsdp.model_auto_sync:
            fsdp.finish_grad_sync()

    def step() -> None:
        optimizer.step(sync_grad_before_optimizer_step=False)  # base step, then install_optimized_model_weights
        optimizer.zero_grad()  # base zero_grad, then zero_grad_buffer

    def state() -> dict[str, StateBytes]:
        held = sum(local(t).numel() * local(t).element_size() for s in optimizer.state.values()
                   for t in s.values() if isinstance(t, torch.Tensor))
        master = [g.main_weight_buffer for g in buffers.parameter_groups if g.main_weight_buffer is not None]
        grads = [g.main_grad_buffer for g in buffers.parameter_groups if g.main_grad_buffer is not None]
        return {"optimizer_state": StateBytes(held, strategy != "no_shard", slack=slack(master, world)),
                "master": StateBytes(nbytes(master), strategy != "no_shard", slack=slack(master, world)),
                "grad_buffer": StateBytes(nbytes(grads), strategy in ("optim_grads", "optim_grads_params"),
                                          slack=slack(grads, world))}

    def full_grads() -> dict[str, torch.Tensor | None]:
        """The gradient the optimizer steps on: the distributed parameter's `.grad`, a view of the main grad buffer
        (attached by finish_grad_sync); Megatron-FSDP leaves `.grad` None on a rank whose shard of a parameter is
        empty, so the DTensor it registered for that parameter is read instead (every rank gathers alike)."""
        out = {}
        for name, module, attr in slots:
            g = buffers.dist_main_grad.get(name, getattr(module, attr).grad)
            out[name] = full(g)
        return out

    def full_params() -> dict[str, torch.Tensor | None]:
        """What the module holds after finish_grad_sync and the step: its distributed parameters (the main weights
        the optimizer updated, installed into the compute weights the next forward uses)."""
        return {name: full(getattr(module, attr)) for name, module, attr in slots}

    train = TrainStep(backward=default_backward, finish=finish, step=step, state=state,
                      no_sync=fsdp.no_sync)
    return Wrapped(cast_inputs(fsdp, spec), layers, full_grads, full_params, megatron_fsdp_gathered(buffers, model, layers), world,
                   keep=[mesh(world)], train=train, buffer_layout=megatron_fsdp_layout(buffers))


def local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor | None) -> torch.Tensor | None:
    """A tensor's whole value, cloned (a collective for a sharded DTensor). Megatron-FSDP shards a parameter's rows
    unevenly; its own gather (uneven_dtensor_to_full_tensor) all-gathers shards of unequal sizes, which gloo
    refuses, so each rank's shard travels with the offset Megatron-FSDP's chunk metadata gives it."""
    from torch.distributed.tensor import DTensor, Replicate

    if t is None:
        return None
    if not isinstance(t, DTensor):
        return t.detach().clone()
    if all(isinstance(p, Replicate) for p in t.placements):
        return t.to_local().detach().clone()
    from megatron_fsdp.uneven_dtensor import update_uneven_dtensor_chunk_metadata

    if not hasattr(t._local_tensor, "__create_chunk_list__"):
        update_uneven_dtensor_chunk_metadata(t)
    (chunk,) = t.__create_chunk_list__()
    shards = [None] * dist.get_world_size()  # the mesh's sharded dimension is the world ((world, 1) mesh)
    dist.all_gather_object(shards, (tuple(chunk.offsets), t.to_local().detach().cpu()))
    out = torch.zeros(t.shape, dtype=t.dtype)
    for offsets, shard in shards:
        out[tuple(slice(o, o + n) for o, n in zip(offsets, shard.shape))] = shard
    return out.to(t.to_local().device)


def nbytes(bufs: list) -> int:
    return sum(b.data.numel() * b.data.element_size() for b in bufs if b.data is not None)


def slack(bufs: list, world: int) -> int:
    """Bytes of padding Megatron-FSDP's buffer layout adds (param_and_grad_buffer.build_data_parallel_buffer_index:
    unless no_shard, each item not a multiple of the group's chunk_size_factor -- a row of its weights -- is padded
    to one, and each bucket to a multiple of world x chunk_size_factor), read from the layout's own index: a
    bucket's size less its parameters' elements, a rank's 1/world of it where the buffer is sharded (the first
    ranks' shards hold real elements up to that much beyond an even split, so optimizer state gets the same bound).
    Clean runs need exactly this (16 elements a rank per 32-wide linear group, 2 ranks). Counted over trainable
    groups only and never for a parameter's own elements, so room kept for frozen parameters shows as a surplus."""
    total = 0
    for b in bufs:
        if not any(p.requires_grad for p in b.params):
            continue
        padding = b.bucket_index.size - sum(p.numel() for p in b.params)
        total += (math.ceil(padding / world) if b.is_data_distributed else padding) * b.dtype.itemsize
    return total


ENGINE = Engine("megatron_fsdp", wrap, shards=lambda spec: strategy_of(spec) == "optim_grads_params",
                reshards_after_forward=lambda spec: strategy_of(spec) == "optim_grads_params",
                cpu_steps=(CPU_STEP, SYNC_STEP), steps=(CONFIG_STEP,), casts_params_to=casts_params_to,
                package="megatron_fsdp", reductions=lambda spec: microbatches(spec) if reduces_each_microbatch(spec) else 1)
