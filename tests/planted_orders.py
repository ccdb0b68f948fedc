"""Planted faults that only an accumulation order with every forward first can show (issue 34, item 5), and their
clean twins; `--backend planted_orders:LastInputWgrad` for the torch lane, the wrap functions for the distributed lane.

- LastInputWgrad: every torch.nn.Linear's wgrad reads the input of the layer's latest forward, kept on the module,
  instead of the one its own forward saved: right whenever each backward follows its own forward.
- dp_syncing_by_forward: a data-parallel wrapper that, as DDP does, decides in forward whether the next backward
  reduces (a forward outside no_sync arms it) and disarms after that backward: every forward first, microbatch 1's
  backward reduces what has accumulated then and the later ones add rank-local gradients.
- dp_syncing_in_backward, the clean twin: reduces in the backward that runs outside no_sync, once autograd has
  accumulated every microbatch's gradient."""
from __future__ import annotations

import contextlib
import types
from typing import Iterator

import torch

from planted_accumulation import OtherAccumulation


class LatestInputLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module):
        ctx.module = module
        ctx.save_for_backward(weight)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        x = ctx.module.latest_input  # the fault: the latest forward's input, not this one's
        rows = grad.reshape(-1, grad.shape[-1])
        dw = rows.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        db = rows.sum(0) if ctx.needs_input_grad[2] else None
        return grad @ weight if ctx.needs_input_grad[0] else None, dw, db, None


def _latest_input_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    self.latest_input = x.detach()
    return LatestInputLinear.apply(x, self.weight, self.bias, self)


class LastInputWgrad(OtherAccumulation):
    name = "last_input_wgrad"
    linear_forward = staticmethod(_latest_input_forward)


def _syncing_data_parallel(model, spec, at_forward: bool):
    """A hand-written data-parallel wrapper with a no_sync context: each trainable parameter's gradient summed over the
    ranks once autograd accumulated it in a backward that reduces (grad_divisor 1). Which backward reduces: with
    `at_forward` the first one after a forward run outside no_sync (DDP's rule), else one run outside no_sync."""
    import torch.distributed as dist

    from te_verify.distributed.types import Wrapped, grad_of, param_slots, param_tensors, units_of, value_of

    slots, layers = param_slots(model), units_of(model, spec)
    state = {"quiet": False, "armed": False}

    def reduce(p: torch.nn.Parameter) -> None:
        if (state["armed"] if at_forward else not state["quiet"]):
            dist.all_reduce(p.grad)
            if at_forward:  # the reducer is finalised at the end of this backward
                torch.autograd.Variable._execution_engine.queue_callback(disarm)

    def disarm() -> None:
        state["armed"] = False

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(reduce)

    def forward(x):
        out = model(x)
        if at_forward and not state["quiet"]:
            state["armed"] = True
        return out

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        state["quiet"] = True
        try:
            yield
        finally:
            state["quiet"] = False

    return Wrapped(forward, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                   lambda: [0] * len(layers), 1.0, no_sync=no_sync)


def dp_syncing_by_forward(model, spec):
    return _syncing_data_parallel(model, spec, at_forward=True)


def dp_syncing_in_backward(model, spec):
    return _syncing_data_parallel(model, spec, at_forward=False)
