"""A worked example: your own data-parallel wrapper certified by te_verify as a backend of its own.

`FlatAllReduceDP` is written the way a user writes a minimal DDP: every rank holds the whole model; after backward
(one autograd callback) the gradients that exist are flattened into one buffer, all-reduced once and averaged.
Frozen parameters have no gradient, so they are never communicated.

    pytest cases/test_dist_ddp.py cases/test_dist_lora.py --backend examples.user_wrapper:FlatAllReduceDP
    torchrun --nproc-per-node 2 -m te_verify.distributed --device cpu --wrap examples.user_wrapper:FlatAllReduceDP

Rows, case ids and expectations (`expectations/flat_allreduce_dp.toml`) carry its name, never a built-in one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from te_verify.api import CaseSpec, Wrapped, grad_of, param_slots, param_tensors, units_of, value_of


def _all_reduce_grads(model: nn.Module) -> None:
    """Average every existing gradient over the ranks with one flat all-reduce."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(dist.get_world_size())
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


class FlatAllReduceDP:
    """The declaration te_verify reads (te_verify.distributed.declare)."""

    # Rows' backend name and the wrapper part of case ids.
    name = "flat_allreduce_dp"
    # It keeps whole parameters on every rank: its GEMMs are judged per site, no gathered-parameter timeline.
    shards = False
    # The distributed families whose cases it runs: linear stacks under DDP's patterns, LoRA models.
    families = ("dist_ddp", "dist_lora")

    def wrap(self, model: nn.Module, spec: CaseSpec) -> Wrapped:
        slots = param_slots(model)

        layers = units_of(model, spec)

        def reduce_after_backward(grad: torch.Tensor) -> None:  # once autograd has run every node of this backward
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _all_reduce_grads(model))

        def forward(x: torch.Tensor) -> torch.Tensor:
            out = model(x)
            if out.requires_grad:
                out.register_hook(reduce_after_backward)
            return out

        # Whole parameters on every rank: no gathered storage (the timeline reads zeros, as DDP's).
        return Wrapped(forward, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                       lambda: [0] * len(layers), dist.get_world_size())
