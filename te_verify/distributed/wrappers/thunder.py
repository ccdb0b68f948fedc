"""thunder's own data parallelism on a jitted module: thunder.distributed.ddp / fsdp (thunder 0.2.6 API).

The documented order is `ddp(thunder.jit(model))` / `fsdp(thunder.jit(model))`; fsdp reads LOCAL_RANK (the
pool and torchrun set it). thunder is imported only through te_verify.compat.thunder_named_tensors.
Gradients are read from the very parameters thunder trains (the jitted module's); fsdp shards dim 0 of each
parameter, so its gradients are gathered and trimmed to the original shape.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.compat.thunder import import_thunder
from te_verify.distributed.types import Wrapped, WrapperError, options
from te_verify.spec import CaseSpec


def thunder_unavailable() -> str | None:
    """Why thunder's wrappers cannot run here (thunder does not import: e.g. 0.2.6 on torch >= 2.14, thunder#2833)."""
    try:
        import_thunder()
    except ImportError as exc:
        return str(exc)
    return None


def _gather_dim0(shard: torch.Tensor, rows: int) -> torch.Tensor:
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts)[:rows]


def wrap_thunder_dist(model: nn.Sequential, spec: CaseSpec, opts: dict):
    from te_verify.distributed.types import Wrapped, WrapperError

    thunder = import_thunder()
    import thunder.distributed as tdist

    from te_verify.distributed.types import units_of

    layers = units_of(model, spec)
    shapes = {n: p.shape for n, p in model.named_parameters()}  # qualified names ("<layer>.<name>" for a stack)
    jitted = thunder.jit(model)
    if spec.dist.wrapper == "thunder_ddp":
        unknown = set(opts) - {"bucket_size_in_mb"}
        wrapped = tdist.ddp(jitted, **opts)
    else:
        unknown = set(opts) - {"sharding_strategy"}
        strategy = tdist.FSDPType[opts.get("sharding_strategy", "ZERO3")]
        wrapped = tdist.fsdp(jitted, device=run_device.active(), sharding_strategy=strategy)
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: not {spec.dist.wrapper} options")
    sharded = spec.dist.wrapper == "thunder_fsdp"

    def full_tensors(of) -> dict:
        """`of(parameter)` (its gradient, or itself) by name, gathered along dim 0 where thunder's fsdp shards."""
        out = {}
        for name, p in wrapped.named_parameters():
            key = name.removeprefix("_model.")
            t = of(p)
            if t is not None and sharded:
                t = _gather_dim0(t.detach(), shapes[key][0])
            out[key] = None if t is None else t.detach().clone()
        return out

    return Wrapped(wrapped, layers, lambda: full_tensors(lambda p: p.grad), lambda: full_tensors(lambda p: p),
                   None, dist.get_world_size(), keep=[jitted])


def wrap_thunder(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    return wrap_thunder_dist(model, spec, options(spec))
