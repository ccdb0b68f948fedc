"""Training engines with one planted fault each (the pool's `wrap=`): Megatron-core DDP as shipped, plus state,
a collective or a gradient it must not spend on frozen parameters. The engine checks must catch every one, naming
the parameter and the phase."""
from __future__ import annotations

import torch
import torch.distributed as dist

from te_verify.distributed.engines import megatron_ddp
from te_verify.distributed.types import Wrapped


def _frozen(wrapped: Wrapped) -> list[torch.nn.Parameter]:
    return [p for p in wrapped.model.parameters() if not p.requires_grad]


def _stepping_then(model, spec, after) -> Wrapped:
    """Megatron-core DDP whose optimizer step is followed by `after(wrapped)`."""
    wrapped = megatron_ddp.wrap(model, spec)
    real_step = wrapped.train.step

    def step() -> None:
        real_step()
        after(wrapped)

    wrapped.train.step = step
    return wrapped


def _state_for_frozen(wrapped: Wrapped) -> None:
    for p in _frozen(wrapped):
        wrapped.keep[0].state[p]["momentum_buffer"] = torch.zeros_like(p)  # keep[0]: its optimizer


def _gather_frozen(wrapped: Wrapped) -> None:
    for p in _frozen(wrapped):
        dist.all_gather([torch.empty_like(p) for _ in range(dist.get_world_size())], p.detach())


def megatron_ddp_with_state_for_frozen(model, spec) -> Wrapped:
    """Its optimizer step makes a momentum buffer for every frozen parameter too."""
    return _stepping_then(model, spec, _state_for_frozen)


def megatron_ddp_gathering_frozen_after_step(model, spec) -> Wrapped:
    """After every optimizer step it all-gathers every frozen parameter (which never changes)."""
    return _stepping_then(model, spec, _gather_frozen)


def megatron_ddp_reducing_frozen_grads(model, spec) -> Wrapped:
    """Its grad sync gives every frozen parameter a gradient and all-reduces it, then drops it."""
    wrapped = megatron_ddp.wrap(model, spec)
    real_finish = wrapped.train.finish

    def finish() -> None:
        for p in _frozen(wrapped):
            p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad = None
        real_finish()

    wrapped.train.finish = finish
    return wrapped


def megatron_ddp_with_main_grad_for_frozen(model, spec) -> Wrapped:
    """Every frozen weight gets a main_grad buffer too (Megatron-LM PR #688 / #578's other side)."""
    wrapped = megatron_ddp.wrap(model, spec)
    for p in (p for p in model.parameters() if not p.requires_grad):
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    return wrapped
