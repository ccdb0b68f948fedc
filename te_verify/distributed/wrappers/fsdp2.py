"""FSDP2 (fully_shard): one unit per layer or block on a mesh of the rank's device type."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.distributed.policy import policy_dtypes
from te_verify.distributed.types import (Wrapped, WrapperError, grad_of, options, param_slots, param_tensors,
                                         storage_bytes, units_of, value_of)
from te_verify.spec import CaseSpec


def wrap_fsdp2(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    opts = options(spec)
    reshard = opts.pop("reshard_after_forward", True)
    if opts:
        raise WrapperError(f"dist.options {sorted(opts)}: FSDP2 takes reshard_after_forward only")
    # The rank's device type: a CUDA mesh with gloo on a GPU host segfaults (#132471), so --device cpu keeps a CPU one.
    mesh = init_device_mesh(run_device.active().type, (dist.get_world_size(),))
    slots, layers = param_slots(model), units_of(model, spec)
    param_dtype, reduce_dtype = policy_dtypes(spec)  # the spec's policy (None: FSDP2's default, no casts)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)

    def full(t: torch.Tensor | None) -> torch.Tensor | None:  # a DTensor's whole value (a collective)
        return None if t is None else t.full_tensor()

    def gathered() -> list[int]:
        sizes = []
        for layer in layers:
            group = layer._get_fsdp_state()._fsdp_param_group
            sizes.append(sum(storage_bytes(t) for fp in group.fsdp_params for t in fp.all_gather_outputs))
        return sizes

    return Wrapped(model, layers, lambda: param_tensors(slots, lambda p: full(p.grad)),
                   lambda: param_tensors(slots, full), gathered, dist.get_world_size(), keep=[mesh],
                   no_sync=lambda: without_gradient_sync(model))


@contextlib.contextmanager
def without_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's documented accumulation switch as a context: set_requires_gradient_sync(False) on the root (it
    recurses into every unit), True again on leaving."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
