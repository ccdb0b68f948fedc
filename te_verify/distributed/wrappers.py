"""Wrap a model per spec.dist: DDP, FSDP1, FSDP2, fairscale FSDP, thunder ddp/fsdp. Runs inside a rank.

Every wrapper yields a `Wrapped`: the callable, the units it wraps (a stack's nn.Linear layers; a model family's
blocks -- sharded wrappers make one FSDP unit per unit, hooks and the timeline act on them), how to read full
gradients after backward (gathered for sharded wrappers), by the parameters' qualified names in the unwrapped
model, and how many bytes of gathered (unsharded) parameter storage each unit holds right now -- the observation
the reshard-timing check uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.training import TrainStep
from te_verify.models import family_of
from te_verify.spec import CaseSpec


class WrapperError(ValueError):
    """An unknown wrapper or option; the message names it."""


@dataclass
class Wrapped:
    """A wrapped model and how to observe it."""

    # The callable under test: x -> output.
    module: Callable[[torch.Tensor], torch.Tensor]
    # The units in model order (the very modules the wrapper runs): a stack's nn.Linear layers, a family's blocks.
    layers: list[nn.Module]
    # Full (unsharded) gradients by qualified parameter name in the unwrapped model ("<layer>.<weight|bias>" for a
    # stack, e.g. "blocks.0.attn.q.lora_a.weight" for a family); may run collectives, so call after counting stops.
    full_grads: Callable[[], dict[str, torch.Tensor | None]]
    # Full (unsharded) parameter values, keyed the same way: what the run left in the model.
    full_params: Callable[[], dict[str, torch.Tensor | None]]
    # Bytes of gathered parameter storage per layer now; None when the wrapper cannot be observed.
    gathered_bytes: Callable[[], list[int]] | None = None
    # Factor by which the wrapper divides the summed gradients (it averages over ranks).
    grad_divisor: float = 1.0
    # Anything the rank must keep alive for the case (meshes, process groups).
    keep: list = field(default_factory=list)
    # The unwrapped model object (set by case_runner.prepare): its linears, in module order, are the oracle's sites.
    model: nn.Module | None = None
    # A training engine's step (distributed.training): its backward, finish, optimizer step and state. None for a
    # wrapper that only computes gradients (DDP, FSDP): the lane then runs one plain forward and backward.
    train: TrainStep | None = None


# A parameter's place, taken before wrapping: (qualified name, owning module, attribute). Reading the attribute
# after wrapping reaches the wrapper's parameter (FSDP2's DTensor, FSDP1's use_orig_params view) by its old name.
Slot = tuple[str, nn.Module, str]


def param_slots(model: nn.Module) -> list[Slot]:
    """Every parameter's slot, in module order (a stack: "<layer>.<weight|bias>")."""
    return [(f"{prefix}.{attr}" if prefix else attr, module, attr)
            for prefix, module in model.named_modules() for attr, _ in module.named_parameters(recurse=False)]


def units_of(model: nn.Module, spec: CaseSpec) -> list[nn.Module]:
    """What a wrapper wraps one by one: a stack's layers, a model family's blocks (run in sequence)."""
    return list(model) if spec.model is None else family_of(spec).blocks(model)


def options(spec: CaseSpec) -> dict:
    return dict(spec.dist.options)


def param_tensors(slots: list[Slot], of: Callable[[nn.Parameter], torch.Tensor | None]
                  ) -> dict[str, torch.Tensor | None]:
    """`of(parameter)` (its gradient, or itself) for every parameter, cloned, by qualified name."""
    out = {}
    for name, module, attr in slots:
        t = of(getattr(module, attr))
        out[name] = None if t is None else t.detach().clone()
    return out


def grad_of(p: nn.Parameter) -> torch.Tensor | None:
    return p.grad


def value_of(p: nn.Parameter) -> torch.Tensor:
    return p


def storage_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    return t.untyped_storage().nbytes()


def wrap_ddp(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from torch.nn.parallel import DistributedDataParallel as DDP

    opts = options(spec)
    unknown = set(opts) - {"find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb"}
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: not DDP options")
    slots, layers = param_slots(model), units_of(model, spec)
    ddp = DDP(model, **opts)
    ddp.register_comm_hook(None, averaging_allreduce_hook)
    return Wrapped(ddp, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                   lambda: [0] * len(layers), dist.get_world_size())


def averaging_allreduce_hook(state, bucket):
    """DDP's default all-reduce written in Python, so the collective counter sees each bucket's bytes."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])


def wrap_fsdp1(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    opts = options(spec)
    strategy = opts.pop("sharding", "FULL_SHARD")
    if opts or strategy not in ShardingStrategy.__members__:
        raise WrapperError(f"dist.options {spec.dist.options!r}: FSDP1 takes sharding=FULL_SHARD|SHARD_GRAD_OP|NO_SHARD")
    slots, layers = param_slots(model), units_of(model, spec)
    # One FSDP unit per unit (a stack's nn.Linear layers, a family's blocks), as a user wraps a transformer.
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({type(u) for u in layers}), device_id=run_device.active(),
                use_orig_params=True, sharding_strategy=ShardingStrategy[strategy])
    units = [m for m in fsdp.modules() if isinstance(m, FSDP) and m is not fsdp]

    def full_grads() -> dict:
        with FSDP.summon_full_params(fsdp, with_grads=True):
            return param_tensors(slots, grad_of)

    def full_params() -> dict:
        with FSDP.summon_full_params(fsdp):
            return param_tensors(slots, value_of)

    def gathered() -> list[int]:
        return [storage_bytes(getattr(u._handle.flat_param, "_full_param_padded", None)) if u._handle else 0
                for u in units]

    return Wrapped(fsdp, layers, full_grads, full_params, gathered, dist.get_world_size())


def wrap_fsdp2(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    opts = options(spec)
    reshard = opts.pop("reshard_after_forward", True)
    if opts:
        raise WrapperError(f"dist.options {sorted(opts)}: FSDP2 takes reshard_after_forward only")
    # The rank's device type: a CUDA mesh with gloo on a GPU host segfaults (#132471), so --device cpu keeps a CPU one.
    mesh = init_device_mesh(run_device.active().type, (dist.get_world_size(),))
    slots, layers = param_slots(model), units_of(model, spec)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)

    def full(t: torch.Tensor | None) -> torch.Tensor | None:  # a DTensor's whole value (a collective)
        return None if t is None else t.full_tensor()

    def gathered() -> list[int]:
        sizes = []
        for layer in layers:
            group = layer._get_fsdp_state()._fsdp_param_group
            sizes.append(sum(storage_bytes(t) for fp in group.fsdp_params for t in fp.all_gather_outputs))
        return sizes

    return Wrapped(model, layers, lambda: param_tensors(slots, lambda p: full(p.grad)),
                   lambda: param_tensors(slots, full), gathered, dist.get_world_size(), keep=[mesh])


def wrap_fairscale(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from te_verify.distributed.fairscale_compat import wrap_fairscale_fsdp

    if spec.model is not None:  # matrix_dist generates none: its per-layer unit bookkeeping is a stack's
        raise WrapperError(f"model={spec.model.tag}: the fairscale wrapper here wraps linear stacks only")
    return wrap_fairscale_fsdp(model, spec, options(spec))


def wrap_thunder(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from te_verify.distributed.thunder_dist import wrap_thunder_dist

    return wrap_thunder_dist(model, spec, options(spec))


WRAPPERS: dict[str, Callable[[nn.Sequential, CaseSpec], Wrapped]] = {
    "ddp": wrap_ddp,
    "fsdp": wrap_fsdp1,
    "fsdp2": wrap_fsdp2,
    "fairscale_fsdp": wrap_fairscale,
    "thunder_ddp": wrap_thunder,
    "thunder_fsdp": wrap_thunder,
}


def wrap(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from te_verify.distributed.engines import engine
    from te_verify.spec import WRAPPERS as ALL_WRAPPERS  # the built-in wrappers and the engines

    trainer = engine(spec.dist.wrapper) if spec.dist is not None else None
    if trainer is not None:
        return trainer.wrap(model, spec)
    if spec.dist is None or spec.dist.wrapper not in WRAPPERS:
        raise WrapperError(f"spec.dist={spec.dist!r}: expected a wrapper among {sorted(ALL_WRAPPERS)}")
    return WRAPPERS[spec.dist.wrapper](model, spec)
