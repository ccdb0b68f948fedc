"""The whole training step of a training engine (Megatron-core DDP, Megatron-FSDP, DeepSpeed ZeRO) in a rank, and the
single-process eager SGD it is judged against.

An engine's case runs ITERATIONS iterations of: forward and backward of every microbatch (the engine's backward,
its no-sync context on all but the last), the engine's finish (Megatron's finish_grad_sync: phase "backward_end"),
the gradients read (the first iteration's are compared with eager's), the optimizer step (phase "step"), the
parameters read (compared with eager SGD's after the same number of steps). Collectives of every iteration are
recorded: ZeRO-3 traces its first iteration and Megatron's overlap dispatches from its second, so waste of either
kind shows in one of them. The optimizer is SGD with momentum (lr LR, momentum MOMENTUM), so an engine keeps
optimizer state and the state of frozen parameters is observable.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch import nn

from te_verify.models import frozen_at_backward, make_inputs
from te_verify.spec import CaseSpec

ITERATIONS = 2
LR = 0.1
MOMENTUM = 0.9


def sgd(params) -> torch.optim.SGD:
    """The optimizer every engine case and its eager reference use."""
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


@dataclass(frozen=True)
class StateBytes:
    """Bytes one rank holds in one category of engine state (one fp32 element per trainable element: SGD's momentum,
    a master copy, a gradient), and whether the engine shards that category."""

    # Bytes held by this rank.
    nbytes: int
    # Sharded over the data-parallel ranks (a rank needs its share of the trainable parameters' room only).
    sharded: bool
    # Bytes of padding the engine's layout may add beyond that (bucket alignment), as its file documents.
    slack: int = 0


@dataclass
class TrainStep:
    """How an engine trains, besides calling its module on a microbatch."""

    # Backward of one microbatch's output against its cotangent (DeepSpeed's engine.backward of the equivalent loss).
    backward: Callable[[torch.Tensor, torch.Tensor], None]
    # What runs after the last microbatch's backward before gradients are read (Megatron's finish_grad_sync).
    finish: Callable[[], None]
    # The optimizer step, and gradients zeroed for the next iteration.
    step: Callable[[], None]
    # What the engine holds per category now, on this rank (checks.training.MADE_IN's keys); read after a step.
    state: Callable[[], dict[str, StateBytes]]
    # Context for a microbatch whose gradients must not be synchronised yet (Megatron's no_sync); None: none.
    no_sync: Callable[[], ContextManager] | None = None


def default_backward(out: torch.Tensor, cotangent: torch.Tensor) -> None:
    out.backward(cotangent)


def microbatches(spec: CaseSpec) -> int:
    return int(dict(spec.dist.options).get("microbatches", 1)) if spec.dist is not None else 1


def run_iteration(module: Callable, train: TrainStep, x: torch.Tensor, cotangent: torch.Tensor, chunks: int,
                  set_phase: Callable[[str, int], None]) -> torch.Tensor:
    """Forward and backward of `chunks` microbatches of the shard, then the engine's finish; the shard's output.
    `set_phase(phase, microbatch)` labels what runs next ("forward", "backward", "backward_end")."""
    outs = []
    xs, gs = x.chunk(chunks), cotangent.chunk(chunks)
    for k, (xk, gk) in enumerate(zip(xs, gs)):
        quiet = train.no_sync() if train.no_sync is not None and k < chunks - 1 else contextlib.nullcontext()
        with quiet:
            set_phase("forward", k)
            out = module(xk)
            set_phase("backward", k)
            train.backward(out, gk)
        outs.append(out.detach())
    set_phase("backward_end", chunks - 1)
    train.finish()
    return torch.cat(outs)


def eager_trajectory(spec: CaseSpec, iterations: int = ITERATIONS) -> list[dict[str, torch.Tensor]]:
    """Single-process eager SGD on the global batch: every parameter after each of `iterations` steps, by qualified
    name (a frozen parameter's too: it must not change)."""
    model = frozen_at_backward(spec)
    inputs = make_inputs(spec)
    opt = sgd([p for p in model.parameters() if p.requires_grad])
    after = []
    for _ in range(iterations):
        opt.zero_grad(set_to_none=True)
        model(inputs.x.detach()).backward(inputs.grad_output)
        opt.step()
        after.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return after


def load_te() -> None:
    """Megatron's packages import transformer_engine wherever it is installed: TE's Python over the active --te-impl
    (on a CPU rank, the tex emulation) is loaded first, as the TE lane loads it."""
    from te_verify import te_api

    te_api.active().api


def te_stack(model: nn.Sequential, spec: CaseSpec) -> nn.Sequential:
    """The stack's layers as TE Linear modules of the active --te-impl holding the same Parameters (the TE lane's
    converter), with fuse_wgrad_accumulation where spec.te asks for it: an engine wraps these. High precision only."""
    from te_verify import te_api
    from te_verify.backends.te_eager import convert

    if spec.te.module != "linear" or spec.te.recipe is not None:
        raise ValueError(f"te={spec.te.tag}: the engines run TE's Linear in high precision only")
    return nn.Sequential(*convert(model, spec, te_api.active().api))
