"""Distributed wrappers with one planted fault each (the pool's `wrap=` and the torchrun entry's --wrap): the
distributed checks must catch every one, naming the rank and the element."""
from __future__ import annotations

import torch

from te_verify.distributed.types import Wrapped
from te_verify.training import StateBytes, TrainStep, optimizer_for, optimizer_step
from te_verify.distributed.wrappers import wrap_ddp, wrap_fsdp2


def defer_reshard_fsdp2(model, spec) -> Wrapped:
    """FSDP2 whose reshards during backward all run in a callback at the end of backward."""
    wrapped = wrap_fsdp2(model, spec)
    pending = []

    def run_pending() -> None:
        while pending:
            pending.pop(0)()

    for layer in wrapped.layers:
        group = layer._get_fsdp_state()._fsdp_param_group

        def deferred(real=group.reshard) -> None:
            if torch._C._current_graph_task_id() == -1:  # not in backward: reshard as usual
                return real()
            if not pending:
                torch.autograd.Variable._execution_engine.queue_callback(run_pending)
            pending.append(real)

        group.reshard = deferred  # instance attribute: only this wrapper's groups are affected
    return wrapped


def fsdp2_without_probe(model, spec) -> Wrapped:
    """FSDP2 (it shards) that gives no gathered-parameter probe: its reshard timeline cannot be observed."""
    wrapped = wrap_fsdp2(model, spec)
    wrapped.gathered_bytes = None
    return wrapped


def ddp_skipping_first_weight(model, spec) -> Wrapped:
    """DDP that never all-reduces 0.weight's gradient."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    DDP._set_params_and_buffers_to_ignore_for_model(model, ["0.weight"])
    return wrap_ddp(model, spec)


def _with_forward(wrapped: Wrapped, forward) -> Wrapped:
    wrapped.module = forward
    return wrapped


def ddp_wrong_output(model, spec) -> Wrapped:
    """DDP whose output is 1% off with exact gradients (the offset is detached)."""
    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module
    return _with_forward(wrapped, lambda x: (lambda out: out + 0.01 * out.detach())(inner(x)))


def ddp_writing_frozen_weight(model, spec) -> Wrapped:
    """DDP that writes a cast of the frozen layer 1's weight back into it after forward (a cast cache written
    back; the weight is saved for backward untouched, so no gradient changes... except through dgrad, which
    reads the written value: layer 1's weight is rounded to bf16 only after backward ran)."""
    wrapped = wrap_ddp(model, spec)
    inner, weight = wrapped.module, wrapped.layers[1].weight

    def forward(x):
        out = inner(x)
        out.register_hook(lambda g: _round_after_backward(weight))
        return out

    return _with_forward(wrapped, forward)


def _round_after_backward(weight: torch.nn.Parameter) -> None:
    def write_back() -> None:
        with torch.no_grad():
            weight.copy_(weight.to(torch.bfloat16).to(weight.dtype))

    torch.autograd.Variable._execution_engine.queue_callback(write_back)


def ddp_extra_gemm(model, spec) -> Wrapped:
    """DDP that also multiplies its input by the first weight once more in forward (and drops the result)."""
    wrapped = wrap_ddp(model, spec)
    inner, weight = wrapped.module, wrapped.layers[0].weight

    def forward(x):
        with torch.no_grad():
            torch.mm(x.reshape(-1, x.shape[-1]), weight.t())
        return inner(x)

    return _with_forward(wrapped, forward)


def fsdp2_training_frozen_base(model, spec) -> Wrapped:
    """FSDP2 that leaves the LoRA q projection's base weight trainable (PEFT freezes it): it computes that weight's
    gradient, reduce-scatters it and leaves it in .grad."""
    model.blocks[0].attn.q.base.weight.requires_grad_(True)
    return wrap_fsdp2(model, spec)


def ddp_reducing_frozen_base(model, spec) -> Wrapped:
    """DDP that, at the end of backward, also all-reduces a zero gradient for every frozen parameter (the LoRA
    base weights): gradients stay exact, the communication does not."""
    import torch.distributed as dist

    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module
    frozen = [p for p in model.parameters() if not p.requires_grad]

    def reduce_frozen() -> None:
        for p in frozen:
            dist.all_reduce(torch.zeros_like(p))

    def forward(x):
        out = inner(x)
        out.register_hook(lambda g: torch.autograd.Variable._execution_engine.queue_callback(reduce_frozen))
        return out

    return _with_forward(wrapped, forward)


class PlantedSkippingDDP:
    """ddp_skipping_first_weight declared as a user's wrapper of its own (the torchrun entry's --wrap)."""

    name = "planted_skipping_ddp"
    shards = False
    families = ("dist_ddp",)
    wrap = staticmethod(ddp_skipping_first_weight)


def ddp_hanging_on_rank_1(model, spec) -> Wrapped:
    """DDP whose forward never returns on rank 1 (a rank stuck in a kernel or a dead peer): rank 0 then waits in the
    next collective for as long as gloo lets it."""
    import time

    import torch.distributed as dist

    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module

    def forward(x):
        while dist.get_rank() == 1:
            time.sleep(1)
        return inner(x)

    return _with_forward(wrapped, forward)


class PlantedHangingDDP:
    """ddp_hanging_on_rank_1 declared as a user's wrapper (the torchrun entry's --wrap)."""

    name = "planted_hanging_ddp"
    shards = False
    families = ("dist_ddp",)
    wrap = staticmethod(ddp_hanging_on_rank_1)


class UndeclaredSharding:
    """A declaration that leaves out whether it shards."""

    name = "undeclared_sharding"
    wrap = staticmethod(ddp_skipping_first_weight)


def ddp_broadcasting_params(model, spec) -> Wrapped:
    """DDP that broadcasts every parameter from rank 0 before each forward (keeping replicas in sync), frozen ones
    included: values identical on every rank already, and a frozen one never changes."""
    import torch.distributed as dist

    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module

    def forward(x):
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        return inner(x)

    return _with_forward(wrapped, forward)


def ddp_all_reducing_frozen_copies(model, spec) -> Wrapped:
    """DDP that, at the end of backward, all-reduces (and averages back) a flat copy of the frozen parameters' values:
    values unchanged, a collective nothing needs; only their content names them."""
    import torch.distributed as dist

    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module
    frozen = [p for p in model.parameters() if not p.requires_grad]

    def sync_frozen() -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in frozen])
        dist.all_reduce(flat)

    def forward(x):
        out = inner(x)
        out.register_hook(lambda g: torch.autograd.Variable._execution_engine.queue_callback(sync_frozen) and None)
        return out

    return _with_forward(wrapped, forward)


def ddp_keeping_every_output(model, spec) -> Wrapped:
    """DDP that keeps a detached copy of every step's output (a debugging cache left on): memory grows each step."""
    wrapped = wrap_ddp(model, spec)
    inner, kept = wrapped.module, []

    def forward(x):
        out = inner(x)
        kept.append(out.detach().clone())
        return out

    return _with_forward(wrapped, forward)


def ddp_writing_its_input(model, spec) -> Wrapped:
    """DDP that halves the caller's input shard in place once backward is done (a buffer it thought its own):
    gradients and outputs exact, the caller's tensor changed."""
    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module

    def forward(x):
        out = inner(x)

        def halve() -> None:
            x.data.div_(2)

        out.register_hook(lambda g: torch.autograd.Variable._execution_engine.queue_callback(halve) and None)
        return out

    return _with_forward(wrapped, forward)


def ddp_unfreezing_after_backward(model, spec) -> Wrapped:
    """DDP that sets requires_grad on every parameter once backward is done (a finalize hook that 'restores' a
    state it never saved): frozen parameters leave the step trainable."""
    wrapped = wrap_ddp(model, spec)
    inner = wrapped.module

    def forward(x):
        out = inner(x)

        def unfreeze() -> None:
            for p in model.parameters():
                p.requires_grad_(True)

        out.register_hook(lambda g: torch.autograd.Variable._execution_engine.queue_callback(unfreeze) and None)
        return out

    return _with_forward(wrapped, forward)


def _ddp_engine(model, spec, decay_frozen: bool = False, declare_state: bool = True) -> Wrapped:
    """A user's training engine on DDP: SGD over the trainable parameters once DDP has averaged their gradients,
    its momentum declared as its state. `decay_frozen`: the planted fault, a weight decay that reaches the frozen
    weights too (each step multiplies them by 0.99)."""
    wrapped = wrap_ddp(model, spec)
    params = list(wrapped.module.parameters())
    optimizer = optimizer_for(wrapped.module)
    frozen = [p for p in params if not p.requires_grad]

    def step() -> None:
        optimizer_step(optimizer)
        if decay_frozen:
            with torch.no_grad():
                for p in frozen:
                    p.mul_(0.99)

    def state() -> dict:
        held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor))
        return {"optimizer_state": StateBytes(held, sharded=False)}

    wrapped.train = TrainStep(step=step, state=state if declare_state else None, no_sync=wrapped.module.no_sync)
    return wrapped


def ddp_engine(model, spec) -> Wrapped:
    return _ddp_engine(model, spec)


def ddp_engine_decaying_frozen(model, spec) -> Wrapped:
    return _ddp_engine(model, spec, decay_frozen=True)


def ddp_engine_without_state(model, spec) -> Wrapped:
    return _ddp_engine(model, spec, declare_state=False)


def _hooked_data_parallel(model, spec, rehook: bool) -> Wrapped:
    """A hand-written data-parallel wrapper: each parameter it hooks sums its gradient over the ranks once autograd
    has accumulated it (the caller's cotangent is not scaled: grad_divisor 1). It hooks the parameters that need a
    gradient when it wraps; with `rehook`, also those that need one at any later call."""
    import torch.distributed as dist

    from te_verify.distributed.types import grad_of, param_slots, param_tensors, units_of, value_of

    slots, layers, hooked = param_slots(model), units_of(model, spec), set()

    def hook_trainable() -> None:
        for p in model.parameters():
            if p.requires_grad and id(p) not in hooked:
                hooked.add(id(p))
                p.register_post_accumulate_grad_hook(lambda q: dist.all_reduce(q.grad))

    def forward(x):
        if rehook:
            hook_trainable()
        return model(x)

    hook_trainable()
    return Wrapped(forward, layers, lambda: param_tensors(slots, grad_of), lambda: param_tensors(slots, value_of),
                   lambda: [0] * len(layers), 1.0)


def dp_hooking_trainable_at_wrap(model, spec) -> Wrapped:
    """Reduces only the parameters trainable when it wrapped (DDP's static buckets): one unfrozen later keeps its
    rank-local gradient."""
    return _hooked_data_parallel(model, spec, rehook=False)


def dp_hooking_every_trainable(model, spec) -> Wrapped:
    """The clean twin: hooks every parameter that needs a gradient at each call."""
    return _hooked_data_parallel(model, spec, rehook=True)
