"""fairscale 0.4.13 FSDP on CPU/gloo: a compatibility layer applied only inside a rank process.

fairscale 0.4.13 calls CUDA stream APIs unconditionally (`torch.cuda.stream(self._streams["all_gather"])`,
`current_stream()`, `record_stream`), so on a CPU-only torch its first forward raises KeyError 'all_gather'.
The layer gives fairscale's FSDP module a `torch` whose `cuda` streams are no-ops (CPU ops run in program
order, so stream ordering has nothing to enforce) and whose other CUDA calls raise (compat.cuda_stand_in), makes
`Tensor.record_stream` a no-op, and sets ENABLE_NCCL_BASE_COLLECTIVES=0 (gloo rejects the 2-D input fairscale
passes to `_reduce_scatter_base`).
It is version-guarded: any other fairscale version is refused rather than patched blindly. One FSDP unit
per layer, because flatten_parameters needs uniform requires_grad per unit.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.compat.cuda_stand_in import confine
from te_verify.distributed.types import Wrapped, WrapperError, options
from te_verify.spec import CaseSpec

STEP = ("fairscale-cpu-streams: fairscale 0.4.13 FSDP uses CUDA streams unconditionally; inside distributed "
        "ranks its torch.cuda stream calls and Tensor.record_stream are no-ops and "
        "ENABLE_NCCL_BASE_COLLECTIVES=0 (gloo)")


def apply(device: torch.device) -> ModuleType:
    """Install the layer (once per process, whose ranks run on the CPU) and return fairscale's FSDP module."""
    if device.type == "cuda":
        return importlib.import_module("fairscale.nn.data_parallel.fully_sharded_data_parallel")
    os.environ["ENABLE_NCCL_BASE_COLLECTIVES"] = "0"  # read at fairscale import time
    torch.Tensor.record_stream = lambda self, stream: None
    # fairscale asks whether CUDA is available to pick its stream path, and reads memory counters for its logs.
    return confine("fairscale.nn.data_parallel.fully_sharded_data_parallel",
                   ("Stream", "current_stream", "stream", "synchronize"), STEP,
                   answers={"is_available": lambda: True, "memory_allocated": lambda *a, **k: 0,
                            "max_memory_allocated": lambda *a, **k: 0})


def _full_from_shards(p: torch.Tensor, shard_grad: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(shard_grad) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard_grad.contiguous())
    return torch.cat([t.reshape(-1) for t in parts])[: p._orig_size.numel()]


def _unit_tensors(index: int, unit, layer: nn.Module, out: dict, of) -> None:
    """Full values of `of(shard parameter)` (its gradient, or itself) of one per-layer unit, split back into the
    layer's weight and bias."""
    names = [n for n, _ in layer.named_parameters(recurse=False)]
    for p in unit.params:
        infos = getattr(p, "_param_infos", None)
        members = [n for _, _, n in infos] if infos else [n for n in names if getattr(layer, n) is p]
        shard = of(p)
        if shard is None:
            out.update({f"{index}.{n}": None for n in members})
            continue
        full = _full_from_shards(p, shard.detach())
        shapes = p._param_shapes if infos else [p._orig_size]
        offset = 0
        for n, shape in zip(members, shapes):
            numel = torch.Size(shape).numel()
            out[f"{index}.{n}"] = full[offset:offset + numel].view(shape).clone()
            offset += numel


def wrap_fairscale_fsdp(model: nn.Sequential, spec: CaseSpec, opts: dict):
    from te_verify.distributed.types import Wrapped, WrapperError, storage_bytes

    unknown = set(opts) - {"reshard_after_forward", "flatten_parameters"}
    if unknown:
        raise WrapperError(f"dist.options {sorted(unknown)}: fairscale FSDP takes reshard_after_forward, flatten_parameters")
    device = run_device.active()
    FSDP = apply(device).FullyShardedDataParallel
    kwargs = dict(opts, compute_device=device)
    layers = list(model)
    units = [FSDP(layer, **kwargs) for layer in layers]
    root = FSDP(nn.Sequential(*units), **kwargs)

    def full_tensors(of) -> dict:
        out: dict = {}
        for i, (unit, layer) in enumerate(zip(units, layers)):
            _unit_tensors(i, unit, layer, out, of)
        return out

    def gathered() -> list[int]:
        return [sum(storage_bytes(getattr(p, "_full_param_padded", None)) for p in unit.params) for unit in units]

    # After backward every unit holds its shard in p.data (the full parameter is freed).
    return Wrapped(root, layers, lambda: full_tensors(lambda p: p.grad), lambda: full_tensors(lambda p: p.data),
                   gathered, dist.get_world_size(), keep=units, no_sync=root.no_sync)


def wrap_fairscale(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    if spec.model is not None:  # matrix.dist generates none: its per-layer unit bookkeeping is a stack's
        raise WrapperError(f"model={spec.model.tag}: the fairscale wrapper here wraps linear stacks only")
    return wrap_fairscale_fsdp(model, spec, options(spec))
