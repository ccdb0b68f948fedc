"""DDP, with its all-reduce written in Python so the collective counter sees each bucket."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from te_verify import device as run_device
from te_verify.distributed.types import (Wrapped, WrapperError, grad_of, options, param_slots, param_tensors,
                                         storage_bytes, units_of, value_of)
from te_verify.spec import CaseSpec


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
                   lambda: [0] * len(layers), dist.get_world_size(), no_sync=ddp.no_sync)


def averaging_allreduce_hook(state, bucket):
    """DDP's default all-reduce written in Python, so the collective counter sees each bucket's bytes."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
