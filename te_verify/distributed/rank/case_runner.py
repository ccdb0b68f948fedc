"""Run one distributed case inside a rank (pool rank or torchrun rank) and return what it observed.

Every rank builds the identical seeded model, freezes it as the spec says (before or after wrapping),
wraps it, feeds its shard of the global batch, and runs one backward pass with its shard of the cotangent
scaled by the wrapper's gradient divisor, so that averaged gradients equal eager gradients on the global
batch. Collectives are recorded (by phase, and by what they carry: distributed.carried) and the gathered-parameter
timeline while forward and backward run. Then every rank takes three more plain steps (a wrapper's collectives counted
as iterations 2-4'); the net growth of live memory over the last is the rank's memory_retained (probes.retention).
Everything is made on the rank's device (te_verify.device, set by the pool or the torchrun entry); the outcome
travels back as host copies.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from te_verify.checks.collectives import Collective
from te_verify.distributed.rank.accumulate import accumulate
from te_verify.distributed.rank.carried import Attribution, ContentIndex, held_tensors
from te_verify.distributed.rank.training import microbatches
from te_verify.training import StateBytes
from te_verify.training import chunked, run_iteration
from te_verify.distributed.rank.observe import CollectiveCounter, Timeline, capture_boundaries, keep_boundaries
from te_verify.distributed.types import Slot, Wrapped, WrapperError, param_slots
from te_verify.distributed.wrappers import wrap
from te_verify.run.isolation import fresh_case
from te_verify.distributed.schedule import scheduled_iterations
from te_verify.models import (FAMILIES, CaseInputs, apply_schedule, build_model, freeze, make_inputs, set_frozen,
                              unfreeze_all)
from te_verify.probes import dispatch
from te_verify.probes.retention import Retention
from te_verify.run.process_state import kept
from te_verify.record import TensorState
from te_verify.run.iteration_probes import IterationProbes
from te_verify.distributed.rank.later import later_step, rank_probes, set_phases
from te_verify.run.runner import input_states, set_phase
from te_verify.spec import CaseSpec


@dataclass
class DistCase:
    """What the pool sends to every rank."""

    # The case.
    spec: CaseSpec
    # Replaces te_verify.distributed.wrappers.wrap (planted faults in tests); module-level, picklable.
    wrap: Callable[[nn.Sequential, CaseSpec], Wrapped] | None = None


@dataclass
class RankOutcome:
    """One rank's observations of one case (all picklable)."""

    # The rank.
    rank: int
    # Full gradients by qualified parameter name, "<layer>.<weight|bias>" for a stack (None where it is None).
    grads: dict[str, torch.Tensor | None]
    # Full gradient of the global input, gathered from every rank's shard (None if the input needs none).
    input_grad: torch.Tensor | None
    # Every collective call during forward and backward (and what ran after autograd's nodes: "step"), with what
    # it carried.
    collectives: list[Collective]
    # (event, boundary, gathered bytes per layer) in backward order; empty when not observable.
    timeline: list[tuple[str, int, list[int]]]
    # The forward output of the global batch, gathered from every rank's shard.
    output: torch.Tensor | None = None
    # Full parameter values after the run, by "<layer>.<weight|bias>" (what the run left in the model).
    params: dict[str, torch.Tensor | None] = field(default_factory=dict)
    # The model's buffers after the run, by qualified name (no wrapper here shards buffers): a library model's
    # rotary tables and index buffers.
    buffers: dict[str, torch.Tensor | None] = field(default_factory=dict)
    # This rank's waste probes (GEMMs, saved tensors, peak memory) over its shard: figures and observations.
    figures: dict = field(default_factory=dict)
    observations: dict = field(default_factory=dict)
    # Every parameter's requires_grad after the run, by its qualified name before wrapping.
    requires_grad_after: dict[str, bool] = field(default_factory=dict)
    # The rank's input shard and cotangent (the caller's tensors) before and after the run.
    inputs_before: dict[str, TensorState] = field(default_factory=dict)
    inputs_after: dict[str, TensorState] = field(default_factory=dict)
    # A training engine's full parameters after each optimizer step (distributed.rank.training); empty for a wrapper.
    params_after_steps: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    # A training engine's state bytes per category after its last step, on this rank (None: its TrainStep has no state).
    engine_state: dict[str, StateBytes] | None = field(default_factory=dict)
    # Under a freeze schedule, a wrapper's full gradients of iterations 2.. (distributed.schedule), and what it
    # raised at a change (None: nothing).
    scheduled_grads: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    schedule_error: str | None = None
    # The waste probes' (figures, observations) of each later iteration (2, 3, ...) this rank ran probed: a wrapper's
    # steps after the measured one, a schedule's iterations, an engine's (checks.iterations judges each).
    later: dict[int, tuple[dict, dict]] = field(default_factory=dict)


def prepare(spec: CaseSpec, wrap_fn: Callable) -> tuple[Wrapped, Attribution, list[Slot]]:
    """Build, freeze before or after wrapping as the spec says, wrap; how to name what a collective carries (the
    parameters' and buffers' values as built, the tensors the wrapper holds at each call); the parameters' slots."""
    model = build_model(spec)
    slots = param_slots(model)  # taken before wrapping: freezing after it reaches the wrapper's parameters by name
    built = {**{name: getattr(module, attr).detach().clone() for name, module, attr in slots},
             **{f"buffer:{name}": b.detach().clone() for name, b in model.named_buffers()}}
    if spec.freeze_timing in ("before", "unfreeze_after"):
        freeze(model, spec)
    wrapped = wrap_fn(model, spec)
    wrapped.model = model
    if spec.model is None:
        if spec.freeze_timing == "after":
            set_frozen(wrapped.layers, spec.weight_frozen, spec.bias_frozen)
        elif spec.freeze_timing == "unfreeze_after":
            unfreeze_all(wrapped.layers)
    elif spec.freeze_timing != "before":
        freeze_slots(slots, spec)
    return wrapped, Attribution(ContentIndex(built), lambda: held_tensors(slots, model), wrapped.buffer_layout), slots


def freeze_slots(slots: list[Slot], spec: CaseSpec) -> None:
    """A model family's freezing after wrapping, by the qualified names the parameters had before it: "after"
    applies the family's rule, "unfreeze_after" makes every parameter trainable."""
    trainable = FAMILIES[spec.model.kind].trainable
    for name, module, attr in slots:
        getattr(module, attr).requires_grad_(spec.freeze_timing == "unfreeze_after" or trainable(name, spec.model))


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    size = t.shape[0] // world_size
    return t.detach()[rank * size:(rank + 1) * size].clone()


def gather_batch(t: torch.Tensor | None) -> torch.Tensor | None:
    """Concatenate every rank's shard along the batch dim (all ranks pass a tensor or all pass None)."""
    if t is None:
        return None
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def to_host(grads: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Host copies of a rank's gradients: unpickling a CUDA tensor would open a context on the rank's GPU in
    the caller's process."""
    return {name: None if g is None else g.cpu() for name, g in grads.items()}


def run_dist_case(rank: int, world_size: int, case: DistCase) -> RankOutcome:
    """The pool's per-case callable: run `case` on this rank. What it leaves in the rank's process state (grad mode,
    default dtype, torch.nn.functional, ...: te_verify.run.process_state) is put back, so the rank's next case starts as
    if it were the first."""
    if _UNSETTLED:  # the last case raised on every rank (else the pool was rebuilt): settle what it left in flight
        settle_collectives()
        _UNSETTLED.clear()
    with kept():
        try:
            return _run_dist_case(rank, world_size, case)
        except BaseException as error:
            _UNSETTLED.append(error.__traceback__)  # its frames keep the case's buffers alive until settled
            raise


# A raised case's traceback (its frames hold the wrapper and its buckets), kept until the next case settles its
# collectives: freeing them while gloo still writes into them is the heap corruption settle_collectives prevents.
_UNSETTLED: list = []


def _run_dist_case(rank: int, world_size: int, case: DistCase) -> RankOutcome:
    spec = case.spec
    if spec.replays != 1:
        raise WrapperError(f"replays={spec.replays}: the distributed lane runs one backward pass per case")
    fresh_case(spec)
    began = time.perf_counter()
    wrapped, attribution, slots = prepare(spec, case.wrap or wrap)
    wrap_s = time.perf_counter() - began  # the wrapper's or engine's own set-up (figure wrap_s), not the pool's
    inputs = make_inputs(spec)
    x = shard(inputs.x, rank, world_size).requires_grad_(spec.input_requires_grad)
    cotangent = shard(inputs.grad_output, rank, world_size) * wrapped.grad_divisor
    before = input_states(CaseInputs(x, cotangent))
    counter = CollectiveCounter(attribute=attribution)
    timeline = Timeline(wrapped.gathered_bytes or (lambda: []))
    observe = wrapped.gathered_bytes is not None
    probes = rank_probes(wrapped, spec)
    later = IterationProbes(lambda: rank_probes(wrapped, spec), {})
    with Retention(True) as retention:  # entered first: on CPU it tracks from the measured step on
        outcome = _measured_step(rank, spec, wrapped, x, cotangent, counter, timeline, probes, observe)
        outcome.requires_grad_after = {name: getattr(module, attr).requires_grad for name, module, attr in slots}
        outcome.figures["wrap_s"] = wrap_s
        outcome.inputs_before, outcome.inputs_after = before, input_states(CaseInputs(x, cotangent))
        # Every rank takes the steps (their collectives pair up), after the measured step's observations. The judged
        # one is the fourth: DDP rebuilds its buckets once, in the order gradients became ready, at the start of the
        # second iteration's forward, or of the third with static_graph=True (its first iteration all-reduces late);
        # a one-time allocation (torch.nn.parallel.DistributedDataParallel._rebuild_buckets), measured here.
        if wrapped.train is not None:
            _train_steps(spec, wrapped, x, cotangent, counter, outcome, later)
        outcome.observations["retained"] = retention.second_step(
            wrapped.module, wrapped.model, CaseInputs(x, cotangent), "the wrapper", unjudged=2,
            step=later_step(spec, wrapped, counter, later))
    if spec.schedule and wrapped.train is None:  # after every observation of the measured step
        with dispatch.session():
            outcome.scheduled_grads, outcome.schedule_error = scheduled_iterations(spec, wrapped, x, cotangent,
                                                                                   counter, later)
    outcome.later = later.later
    if spec.schedule:  # what the run left: the schedule's last masks
        outcome.requires_grad_after = {name: getattr(module, attr).requires_grad for name, module, attr in slots}
    settle_collectives()  # while `wrapped` and its buffers are alive
    return outcome


def settle_collectives() -> None:
    """Wait for every collective still in flight, on every process group this rank belongs to. A wrapper may end a
    step with asynchronous work outstanding (Megatron-FSDP prefetches the next iteration's parameter all-gathers after
    its optimizer step); gloo runs it on its own thread and writes into the wrapper's buckets after the case has freed
    them, corrupting the heap of a later case in this rank. A barrier waits for a group's earlier work (gloo's
    ProcessGroupGloo::barrier; on CUDA the device is synchronised too). Every rank has the same groups, made in the
    same order, and reaches here only when its case finished."""
    world = dist.distributed_c10d._world
    for group in list(world.pg_names):
        if dist.get_rank() in dist.get_process_group_ranks(group):
            dist.barrier(group=group)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _measured_step(rank: int, spec: CaseSpec, wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor,
                   counter: CollectiveCounter, timeline: Timeline, probes: list, observe: bool) -> RankOutcome:
    """Forward and backward under the collective counter, the timeline and the probes; what the rank observed."""
    with counter.patched(), contextlib.ExitStack() as probing:
        for probe in probes:
            probing.enter_context(probe)
        if wrapped.train is not None:  # an engine: its microbatches, backward and finish (distributed.rank.training)
            out = _engine_forward_backward(spec, wrapped, x, cotangent, counter, timeline, probes, observe)
        elif spec.microbatches > 1:  # a wrapper's gradient accumulation (distributed.rank.accumulate)
            out = accumulate(spec, wrapped, x, cotangent, lambda name, k: set_phases(counter, probes, name, k),
                             timeline, observe)
        else:
            out = _plain_forward_backward(wrapped, x, cotangent, counter, timeline, probes, observe)
        counter.phase = "step"  # whatever runs after backward returns (an engine's optimizer step: _train_steps)
        if observe:
            timeline.mark("backward_end", -1)
        set_phase(probes, "idle")
    input_grad = None if x.grad is None else x.grad / wrapped.grad_divisor
    gathered, output = gather_batch(input_grad), gather_batch(out.detach())
    return RankOutcome(
        rank=rank,
        grads=to_host(wrapped.full_grads()),
        input_grad=None if gathered is None else gathered.cpu(),
        collectives=counter.calls,
        timeline=timeline.events,
        output=output.cpu(),
        params=to_host(wrapped.full_params()),
        buffers=to_host({name: b.detach().clone() for name, b in wrapped.model.named_buffers()}),
        figures={k: v for probe in probes for k, v in probe.figures().items()},
        observations={k: v for probe in probes for k, v in probe.observations().items()},
    )


def _train_steps(spec: CaseSpec, wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor,
                 counter: CollectiveCounter, outcome: RankOutcome, later: IterationProbes) -> None:
    """An engine's optimizer step after the measured iteration, then spec.iterations - 1 more whole iterations, all
    under the collective counter, each under `later`'s probes (its first microbatch, as the measured one's); the
    parameters after every step and the engine's state after the last."""
    for k in range(spec.iterations):
        counter.iteration, counter.microbatch = k, 0
        with counter.patched():
            if k:
                apply_schedule(wrapped.layers, spec, k + 1)  # a freeze schedule's change, if any, before iteration k+1
                with later.around(k + 1) as probes:
                    run_iteration(wrapped.module, wrapped.train, chunked(x, cotangent, microbatches(spec)),
                                  lambda phase, microbatch: set_phases(counter, probes, phase, microbatch))
                    set_phase(probes, "idle")
            counter.phase = "step"
            wrapped.train.step()
        outcome.params_after_steps.append(to_host(wrapped.full_params()))
    outcome.engine_state = wrapped.train.state() if wrapped.train.state is not None else None


def _engine_forward_backward(spec: CaseSpec, wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor,
                             counter: CollectiveCounter, timeline: Timeline, probes: list,
                             observe: bool) -> torch.Tensor:
    """An engine's measured iteration (its microbatches, backward and finish), each microbatch's layer boundaries
    watched in its backward as a plain wrapper's are."""
    boundaries: dict[int, torch.Tensor] = {}
    handles = keep_boundaries(wrapped.layers, boundaries) if observe else []

    def phase(name: str, microbatch: int) -> None:
        set_phases(counter, probes, name, microbatch)
        if observe and name == "backward":  # this microbatch's forward is done: its boundaries are in `boundaries`
            timeline.watch_boundaries(dict(boundaries))
            timeline.mark("backward_start", len(wrapped.layers))

    try:
        return torch.cat(run_iteration(wrapped.module, wrapped.train, chunked(x, cotangent, microbatches(spec)), phase))
    finally:
        for handle in handles:
            handle.remove()


def _plain_forward_backward(wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor, counter: CollectiveCounter,
                            timeline: Timeline, probes: list, observe: bool) -> torch.Tensor:
    """Forward, then backward of the output against the cotangent, with the layer boundaries watched."""
    set_phases(counter, probes, "forward")
    boundaries, handles = capture_boundaries(wrapped.layers, x) if observe else ({}, [])
    out = wrapped.module(x)
    for handle in handles:
        handle.remove()
    if observe:
        timeline.watch_boundaries(boundaries)
        timeline.mark("backward_start", len(wrapped.layers))
    set_phases(counter, probes, "backward")
    out.backward(cotangent)
    return out
