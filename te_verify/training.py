"""The training step every lane runs: forward and backward of each microbatch (with a case's backward replays),
the finish a backend or engine needs after the last one, the optimizer step. One core for the single-process
lanes (runner) and the distributed lane's training engines (distributed.rank.case_runner).

The optimizer is SGD with momentum (LR, MOMENTUM) over the parameters that train when the step runs, so optimizer
state exists, a wrong gradient moves the parameters, and a frozen parameter must stay bitwise as it was built. A
parameter that accumulates into `main_grad` (TE's fuse_wgrad_accumulation, Megatron's protocol) is stepped on its
main_grad, as Megatron's optimizer steps its fp32 main gradients, and main_grad is zeroed with the gradients.

The single-process lanes set the learning rate per case (first_step_lr): LR, or less where the gradients are large
against the parameters, so that the first step moves the trainable parameters by at most STEP_FRACTION of their norm.
A Llama block under a unit cotangent has gradients a hundred times its parameters, and LR would make its third
iteration overflow; a moved parameter must still be a training step, not a divergence. Every run of a case uses the
reference's rate (runner.Trainer follows it). The distributed engines keep LR: their optimizers are under test.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, Sequence

import torch

LR = 0.1
MOMENTUM = 0.9
# The most the first step may move the trainable parameters, relative to their norm (first_step_lr).
STEP_FRACTION = 0.05

# (phase, microbatch) -> None: labels what runs next ("forward", "backward", "backward_end") for the probes and the
# collective counter.
SetPhase = Callable[[str, int], None]


def sgd(params: Iterable[torch.nn.Parameter]) -> torch.optim.SGD:
    """The optimizer every case of every lane, and its eager reference, uses."""
    return torch.optim.SGD(list(params), lr=LR, momentum=MOMENTUM)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that need a gradient now, each once (tied weights are one Parameter)."""
    seen, params = set(), []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def main_grad_to_grad(params: Iterable[torch.nn.Parameter]) -> None:
    """A parameter whose wgrad accumulated into main_grad is stepped on it (the .grad TE left is None or a dummy)."""
    for p in params:
        main_grad = getattr(p, "main_grad", None)
        if main_grad is not None:
            p.grad = main_grad.detach().to(p.dtype).clone()


def zero_main_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Megatron's zero_grad_buffer: main_grad zeroed, grad_added_to_main_grad cleared for the next iteration."""
    for p in params:
        if getattr(p, "main_grad", None) is not None:
            p.main_grad.zero_()
        if hasattr(p, "grad_added_to_main_grad"):
            p.grad_added_to_main_grad = False


def first_step_lr(params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor | None]) -> float:
    """LR, or the rate at which the first step moves `params` by STEP_FRACTION of their norm if that is smaller
    (momentum starts at the gradient, so the first update is lr x grad)."""
    size = sum(float(p.detach().double().norm()) ** 2 for p in params) ** 0.5
    push = sum(float(g.detach().double().norm()) ** 2 for g in grads if g is not None) ** 0.5
    return min(LR, STEP_FRACTION * size / push) if push > 0 and size > 0 else LR


def set_lr(opt: torch.optim.Optimizer | None, lr: float) -> None:
    for group in (opt.param_groups if opt is not None else ()):
        group["lr"] = lr


def optimizer_for(model: torch.nn.Module) -> torch.optim.SGD | None:
    """sgd over the parameters that train now; None where none does (torch's SGD refuses an empty list)."""
    params = trainable(model)
    return sgd(params) if params else None


def follow_trainable(opt: torch.optim.SGD | None, model: torch.nn.Module, lr: float = LR) -> torch.optim.SGD | None:
    """The optimizer after a freeze schedule changed what trains, as users make it follow: a newly trainable
    parameter joins in a param group of its own at `lr` (Lightning's BaseFinetuning.unfreeze_and_add_param_group); a
    newly frozen one stays in it with grad None, which torch's SGD skips (no update, its momentum kept)."""
    known = {id(p) for group in (opt.param_groups if opt is not None else ()) for p in group["params"]}
    new = [p for p in trainable(model) if id(p) not in known]
    if not new:
        return opt
    if opt is None:
        opt = sgd(new)
    else:
        opt.add_param_group({"params": new})
    set_lr(opt, lr)
    return opt


def optimizer_step(opt: torch.optim.Optimizer | None) -> None:
    """One step over the gradients (main_grad where a parameter keeps one), then every gradient cleared; nothing
    without an optimizer (nothing trains)."""
    if opt is None:
        return
    params = [p for group in opt.param_groups for p in group["params"]]
    main_grad_to_grad(params)
    opt.step()
    opt.zero_grad(set_to_none=True)
    zero_main_grads(params)


# CaseSpec.autocast -> the dtype torch.autocast runs the forward in.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16}


class AutocastForward:
    """A backend's callable called under torch.autocast (CaseSpec.autocast): the mixed-precision forward a user's
    step runs. The region is entered and left inside each call, on the device of the call's input, so backward and
    the optimizer step run outside it as in users' loops, and no autocast state outlives the call
    (process_state would name it)."""

    def __init__(self, fn: Callable, dtype: torch.dtype) -> None:
        self.__wrapped__ = fn
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype):
            return self.__wrapped__(x, *args, **kwargs)


def autocast_forward(fn: Callable, autocast: str) -> Callable:
    """`fn`, or `fn` under torch.autocast in the dtype `autocast` names (AutocastForward); "" means none."""
    return AutocastForward(fn, AUTOCAST_DTYPES[autocast]) if autocast else fn


def default_backward(out: torch.Tensor, cotangent: torch.Tensor) -> None:
    out.backward(cotangent)


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
    """How a backend trains, besides calling its module on a microbatch."""

    # Backward of one microbatch's output against its cotangent (an engine's own backward; the single-process
    # lanes' replays and backward_dw).
    backward: Callable[[torch.Tensor, torch.Tensor], None] = default_backward
    # What runs after the last microbatch's backward before gradients are read (Megatron's finish_grad_sync).
    finish: Callable[[], None] = lambda: None
    # The optimizer step, and gradients zeroed for the next iteration.
    step: Callable[[], None] = lambda: None
    # Context for a microbatch whose gradients must not be synchronised yet (Megatron's no_sync); None: none.
    no_sync: Callable[[], ContextManager] | None = None
    # What the engine holds per category now, on this rank (distributed engines only; checks.training).
    state: Callable[[], dict] | None = None
    # How the module is called on microbatch k (TE's is_first_microbatch); None: module(x).
    forward: Callable[[Callable, torch.Tensor, int], torch.Tensor] | None = None


def run_iteration(module: Callable, train: TrainStep, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  set_phase: SetPhase, on_output: Callable[[int, torch.Tensor], None] | None = None
                  ) -> list[torch.Tensor]:
    """Forward and backward of each (input, cotangent) microbatch, then the finish; the outputs (detached). The
    optimizer step is the caller's, after it has read the gradients. `on_output(k, out)` sees each forward output
    before its backward."""
    outs = []
    for k, (xk, gk) in enumerate(batches):
        quiet = train.no_sync() if train.no_sync is not None and k < len(batches) - 1 else contextlib.nullcontext()
        with quiet:
            set_phase("forward", k)
            out = train.forward(module, xk, k) if train.forward is not None else module(xk)
            if on_output is not None:
                on_output(k, out)
            set_phase("backward", k)
            train.backward(out, gk)
        outs.append(out.detach())
    set_phase("backward_end", len(batches) - 1)
    train.finish()
    return outs


def chunked(x: torch.Tensor, cotangent: torch.Tensor, chunks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One batch split into `chunks` microbatches along the batch dimension."""
    return list(zip(x.chunk(chunks), cotangent.chunk(chunks)))


def eager_trajectory(model: torch.nn.Module, x: torch.Tensor, cotangent: torch.Tensor, iterations: int,
                     before: Callable[[int], bool] = lambda k: False,
                     autocast: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """Single-process eager SGD: every parameter after each of `iterations` steps, by qualified name (a frozen
    parameter's too: it must not change). `before(k)` runs before iteration k (1-based) and says whether it changed
    what trains (a freeze schedule: the optimizer then follows, follow_trainable). `autocast`: every forward under
    torch.autocast in that dtype (a mixed-precision policy's compute; the step stays in the parameters' dtype)."""
    opt = optimizer_for(model)
    after = []
    for k in range(1, iterations + 1):
        if before(k):
            opt = follow_trainable(opt, model)
        with torch.autocast(x.device.type, dtype=autocast, enabled=autocast is not None):
            out = model(x.detach().requires_grad_(x.requires_grad))  # a reentrant checkpoint needs an input that does
        out.backward(cotangent)
        optimizer_step(opt)
        after.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return after
