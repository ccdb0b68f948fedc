"""Run one case on one backend: build, freeze, prepare once, then the training iterations (te_verify.training): the
first one's forward and k backward passes under the probes, the optimizer step, the later iterations."""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch

from te_verify.backends.base import Backend
from te_verify.backends.compilations import count_compilations
from te_verify.models import (CaseInputs, apply_schedule, build_model, freeze, frozen_at_backward, make_inputs,
                              new_state_bytes, unfreeze_all)
from te_verify import training
from te_verify.probes import dispatch
from te_verify.probes.base import Probe
from te_verify.probes.retention import Retention
from te_verify.run.iteration_probes import IterationProbes, bind_probes
from te_verify.run.process_state import watched
from te_verify.record import INPUT_GRAD, Record, Step, TensorState
from te_verify.spec import CaseSpec


def snapshot_grads(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """Clones of every parameter's .grad (None kept as None) and the input's, by qualified name."""
    grads = {name: (p.grad.detach().clone() if p.grad is not None else None) for name, p in model.named_parameters()}
    grads[INPUT_GRAD] = x.grad.detach().clone() if x.grad is not None else None
    return grads


def prepare_frozen(backend: Backend, model: torch.nn.Module, spec: CaseSpec):
    """Freeze before or after the backend prepares the model, as the spec says; return the callable."""
    if spec.freeze_timing in ("before", "unfreeze_after"):
        freeze(model, spec)
    fn = backend.prepare(model, spec)
    if spec.freeze_timing == "after":
        freeze(model, spec)
    elif spec.freeze_timing == "unfreeze_after":
        unfreeze_all([model])
    return fn


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter's and buffer's values, by qualified name."""
    state = {f"param:{n}": p.detach().clone() for n, p in model.named_parameters()}
    state.update({f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()})
    return state


def requires_grad_of(model: torch.nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


def input_states(inputs: CaseInputs, label: str = "") -> dict[str, TensorState]:
    """The caller's input and output cotangent as they are now (`label` tells microbatches apart)."""
    return {f"input x{label}": TensorState.of(inputs.x), f"output cotangent{label}": TensorState.of(inputs.grad_output)}


def warm_up(fn, model: torch.nn.Module, inputs: CaseInputs, steps: int, record: Record) -> None:
    """Run plain forward and backward steps (their outputs go to the record), then clear every gradient so the
    first iteration starts clean: first-call effects, apart from training. An output that needs no gradient (nothing
    trainable, no input gradient) gets no backward, as in a user's loop: the measured step still calls it, and its
    raise is compared with eager's there (checks.replay)."""
    for k in range(steps):
        out = fn(inputs.x)
        record.add_output(out, f"warm-up step {k + 1}", 0)
        if out.requires_grad:
            out.backward(inputs.grad_output)
    model.zero_grad(set_to_none=True)
    inputs.x.grad = None


def set_phase(probes: list[Probe], name: str, index: int = 0) -> None:
    for probe in probes:
        probe.phase(name, index)


def fresh_inputs(inputs: CaseInputs) -> CaseInputs:
    """A copy of a batch (input needing a gradient as the original does, and its cotangent)."""
    x = inputs.x.detach().clone().requires_grad_(inputs.x.requires_grad)
    return CaseInputs(x, inputs.grad_output.detach().clone())


def iteration_batches(inputs: CaseInputs, iterations: int) -> list[CaseInputs]:
    """One batch per iteration, as a training loop feeds one (the same values): the first is the caller's, the rest
    copies, so what a backend writes into one call's input stays there (checks.leftovers.inputs_left reads every
    one) and is not what the next iteration computes with."""
    return [inputs] + [fresh_inputs(inputs) for _ in range(1, iterations)]


def host_copies(values: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Host copies (what a later iteration leaves; on CUDA they stay out of the allocator the retention reads)."""
    return {name: None if v is None else v.detach().to("cpu", copy=True) for name, v in values.items()}


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters()}


def _measured_step(fn, model: torch.nn.Module, inputs: CaseInputs, spec: CaseSpec, record: Record,
                   probes: list[Probe], watchers: list[Probe] = ()) -> torch.Tensor | None:
    """The first iteration's probed forward and its `spec.replays` backward passes; returns the output (None if the
    forward raised). `watchers` (entered by the caller around every iteration) hear the phases too."""
    out, stage = None, 0
    with contextlib.ExitStack() as stack:
        for probe in probes:
            stack.enter_context(probe)
        probes = [*probes, *watchers]
        try:
            set_phase(probes, "forward")
            out = fn(inputs.x)
            set_phase(probes, "idle")  # the harness's own copies are not the run's work or memory
            record.output = record.add_output(out, "iteration 1" if spec.iterations > 1 else "forward", 1)
            for k in range(1, spec.replays + 1):
                stage = k
                set_phase(probes, "backward", k)
                out.backward(inputs.grad_output, retain_graph=k < spec.replays)
                set_phase(probes, "idle")
                record.grads.append(snapshot_grads(model, inputs.x))
        except Exception as exc:  # a raise is an observation the replay check compares with eager's
            record.error, record.error_pass = exc, stage
    return out


class Trainer:
    """The optimizer steps and the iterations after the measured one (te_verify.training's SGD), each recorded as a
    Step of `record`; a raise ends the run there (record.error, its iteration and pass).

    Following a reference (`follow`, the record of the run it is judged against): before iteration k >= 2 the
    trainable parameters and SGD's momentum are set to the reference's after step k - 1, in place (the same
    Parameter objects: a backend's caches of them must notice). So every iteration is judged from the parameters
    the reference had: an error names the iteration and the element that made it, instead of moving every later
    parameter (a wrong gradient in iteration 1 would otherwise make every gradient of iteration 2 differ), and a
    known gap scoped to one parameter stays scoped. What carries over between calls inside the backend (compiled
    code, caches, TE's FP8 scaling state and weight copies) is its own."""

    def __init__(self, fn, model: torch.nn.Module, spec: CaseSpec, record: Record, follow: Record | None = None,
                 batches: list[CaseInputs] | None = None, watchers: list[Probe] = (), probes: list[Probe] = ()
                 ) -> None:
        self.fn, self.model, self.spec, self.record = fn, model, spec, record
        self.follow = follow
        # Fresh waste probes like the first iteration's (`probes`) around every later iteration's passes.
        self.probes = IterationProbes.like(list(probes), model, record)
        # Probes entered around every iteration (spans_iterations): they hear every phase and every step.
        self.watchers = list(watchers)
        # Each iteration's own batch, as a training loop feeds one (iteration_batches), where this trainer runs the
        # iterations (the microbatch families run their own and use it for the steps).
        self.batches = batches or []
        for k, batch in enumerate(self.batches[1:], start=2):
            record.inputs_before.update(input_states(batch, f" (iteration {k})"))
        self.opt = training.optimizer_for(model)
        self.trained = self.in_optimizer()

    def momentum(self) -> dict[str, torch.Tensor]:
        """SGD's momentum buffer of every trained parameter, by name (none before the first step)."""
        if self.opt is None:
            return {}
        bufs = {name: self.opt.state.get(p, {}).get("momentum_buffer") for name, p in self.trained.items()}
        return {name: buf for name, buf in bufs.items() if buf is not None}

    def step(self, iteration: int, grads: dict[str, torch.Tensor | None]) -> None:
        """The optimizer step ending `iteration`, whose gradients were `grads`; the parameters after it. The first
        sets the learning rate: the followed reference's, else training.first_step_lr of this run's."""
        if self.record.lr is None:
            lr = self.follow.lr if self.follow is not None and self.follow.lr is not None else training.first_step_lr(
                self.trained.values(), [grads.get(name) for name in self.trained])
            training.set_lr(self.opt, lr)
            self.record.lr = lr
        training.optimizer_step(self.opt)
        self.model.zero_grad(set_to_none=True)  # a gradient on what does not train (a fault) does not carry over
        dispatch.set_phase("idle")  # the harness's copies are not the run's memory
        for watcher in self.watchers:
            watcher.step_done(iteration)
        self.record.steps.append(Step(iteration, grads, host_copies(params_of(self.model)),
                                      {"momentum": host_copies(self.momentum())}))

    def change(self, k: int) -> None:
        """The freeze schedule's change before iteration k (models.schedule), the optimizer following it
        (training.follow_trainable: a newly frozen parameter stays in it with grad None, so it must stay bitwise)."""
        if not apply_schedule(self.model, self.spec, k):
            return
        self.opt = training.follow_trainable(self.opt, self.model, self.record.lr)  # step 1 set the case's rate
        self.trained = self.in_optimizer()

    def in_optimizer(self) -> dict[str, torch.nn.Parameter]:
        """The parameters the optimizer holds, by name."""
        in_opt = {id(p) for group in self.opt.param_groups for p in group["params"]} if self.opt else set()
        return {name: p for name, p in self.model.named_parameters() if id(p) in in_opt}

    def follow_reference(self, k: int) -> None:
        """The reference's trained parameters and momentum after step k - 1, copied in (see the class docstring)."""
        if self.follow is None or len(self.follow.steps) < k - 1:
            return
        step = self.follow.steps[k - 2]
        momentum = self.momentum()
        with torch.no_grad():
            for name, p in self.trained.items():
                p.copy_(step.params[name])
                if name in momentum and name in step.state.get("momentum", {}):
                    momentum[name].copy_(step.state["momentum"][name])

    def iteration(self, k: int) -> None:
        """Iteration k >= 2: forward, the backward passes, the optimizer step; raises what the backend raised."""
        stage = 0
        try:
            dispatch.set_phase("idle")
            self.change(k)
            self.follow_reference(k)
            batch = self.batches[k - 1]
            with self.probes.around(k) as probes:
                self.hear("forward", 0, probes)
                out = self.fn(batch.x)
                dispatch.set_phase("idle")
                self.record.add_output(out, f"iteration {k}", k, host=True)
                for stage in range(1, self.spec.replays + 1):
                    self.hear("backward", stage, probes)
                    out.backward(batch.grad_output, retain_graph=stage < self.spec.replays)
                del out
                dispatch.set_phase("idle")
            grads = host_copies(snapshot_grads(self.model, batch.x))
            batch.x.grad = None
            dispatch.set_phase("second step")
            self.step(k, grads)
            dispatch.set_phase("second step")
        except Exception as exc:
            self.record.error, self.record.error_pass, self.record.error_iteration = exc, stage, k
            raise

    def hear(self, phase: str, index: int = 0, probes: list[Probe] = ()) -> None:
        """The watchers and this iteration's probes hear what runs next; the dispatch phase is the probes' where the
        iteration is probed (a forward learns its layers' inputs), else "second step" (tracked, nothing learnt)."""
        for watcher in self.watchers:
            watcher.phase(phase, index)
        for probe in probes:
            probe.phase(phase, index)
        dispatch.set_phase(phase if probes else "second step")

    def inputs_left(self) -> dict[str, TensorState]:
        """Every later iteration's batch as the run left it (the caller's first batch is the runner's to read)."""
        states = {}
        for k, batch in enumerate(self.batches[1:], start=2):
            states.update(input_states(batch, f" (iteration {k})"))
        return states

    def rest(self, first: int) -> None:
        """Iterations `first`..spec.iterations, unjudged by the retention check; stops at a raise."""
        for k in range(first, self.spec.iterations + 1):
            if self.record.error is not None:
                return
            try:
                self.iteration(k)
            except Exception:
                return


def run_prepared(fn, model: torch.nn.Module, inputs: CaseInputs, spec: CaseSpec, record: Record,
                 probes: Iterable[Probe] = (), follow: Record | None = None) -> Record:
    """Warm up (unprobed); the first iteration's forward and `spec.replays` backward passes under the probes (what
    the step left in the model is recorded before its optimizer step); then the optimizer step and the later
    iterations (te_verify.training), each recorded as a Step. For a probed run the second iteration is the one
    whose net memory growth the retention check judges (probes.retention). From the second iteration on, a run
    judged against `follow` starts each iteration from its parameters (Trainer). What the run left of the caller's
    tensors and the parameters' requires_grad is recorded at the end."""
    probes = bind_probes(list(probes), model)
    watchers = [p for p in probes if getattr(p, "spans_iterations", False)]
    probes = [p for p in probes if p not in watchers]
    record.inputs_before.update(input_states(inputs))
    step_fn = training.autocast_forward(fn, spec.autocast)  # the case's autocast is part of every forward
    try:
        warm_up(step_fn, model, inputs, spec.warmup_steps, record)
    except Exception as exc:
        record.error, record.error_pass = exc, 0
        return record
    with watching(watchers, fn, record):
        _train(step_fn, model, inputs, spec, record, probes, follow, watchers)
    record.requires_grad_after = requires_grad_of(model)
    return record


@contextlib.contextmanager
def watching(watchers: list[Probe], fn, record: Record) -> Iterator[None]:
    """Probes that watch every iteration, entered around all of them; their figures and observations recorded."""
    for watcher in watchers:
        getattr(watcher, "bind_callable", lambda f: None)(fn)
    with contextlib.ExitStack() as stack:
        for watcher in watchers:
            stack.enter_context(watcher)
        yield
    for watcher in watchers:
        record.figures.update(watcher.figures())
        record.observations.update(watcher.observations())


def _train(fn, model: torch.nn.Module, inputs: CaseInputs, spec: CaseSpec, record: Record, probes: list[Probe],
           follow: Record | None, watchers: list[Probe]) -> None:
    """The iterations of run_prepared: the first under the probes, its step; where the run is probed every later
    iteration under fresh probes of the same kinds (Trainer) and the retention check (its net growth), one dispatch
    watcher kept over all of them (dispatch.session); unprobed, the rest plain."""
    trainer = Trainer(fn, model, spec, record, follow, iteration_batches(inputs, spec.iterations), watchers, probes)
    with dispatch.session(bool(probes)), Retention(bool(probes)) as retention:
        out = _measured_step(fn, model, inputs, spec, record, probes, watchers)
        record.state_after = model_state(model)
        for probe in probes:
            record.figures.update(probe.figures())
            record.observations.update(probe.observations())
        if record.error is None:
            del out  # the measured step's output and graph
            trainer.step(1, record.grads[-1])
            if probes:
                _retained(trainer, retention, inputs, record)
    trainer.rest(spec.iterations + 1 if probes else 2)
    record.inputs_after.update(input_states(inputs))
    record.inputs_after.update(trainer.inputs_left())


def _retained(trainer: Trainer, retention: Retention, inputs: CaseInputs, record: Record) -> None:
    """Every later iteration's net memory growth (probes.retention; one iteration only: a plain step after it), the
    second's as observation "retained", the later ones' in "retained_later" by iteration; stops at a raise."""
    spec, later = trainer.spec, {}
    for k in range(2, max(spec.iterations, 2) + 1):
        if record.error is not None:
            break
        step = (lambda _, k=k: trainer.iteration(k)) if spec.iterations > 1 else None
        seen = retention.second_step(trainer.fn, trainer.model, inputs, step=step, expected=new_state_bytes(spec, k))
        if k == 2:
            record.observations["retained"] = seen
            record.figures["retained_bytes"] = seen.get("bytes")
        else:
            later[k] = {**seen, "expected": new_state_bytes(spec, k)}
    record.observations["retained_later"] = later


def build_prepared(spec: CaseSpec, backend: Backend, record: Record):
    """Build the seeded model and let the backend prepare it; a raise is recorded (pass 0) and gives None. The
    model's state as built is recorded first (what a backend must leave as it found it). Called inside
    process_state.watched(record, spec), which first puts the process in the state every case starts from
    (isolation.fresh_case), whatever ran before."""
    model = build_model(spec)
    record.state_before = model_state(model)
    try:
        return model, prepare_frozen(backend, model, spec)
    except Exception as exc:
        record.error, record.error_pass = exc, 0
        return None


def run_fp64_eager(spec: CaseSpec, follow: Record | None = None) -> Record:
    """Eager on the case's model and inputs in fp64: the truth every tolerance is derived from; following `follow`
    (eager's record) from the second iteration on, so each iteration's truth is exact arithmetic at eager's
    parameters."""
    record = Record(backend="eager_fp64")
    spec = spec.replace(autocast="")  # the truth is exact arithmetic: no autocast
    model = frozen_at_backward(spec).double()
    inputs = make_inputs(spec)
    x = inputs.x.detach().double().requires_grad_(inputs.x.requires_grad) if inputs.x.is_floating_point() else inputs.x
    with watched(record):
        run_prepared(model, model, CaseInputs(x, inputs.grad_output.double()), spec, record, follow=follow)
    return record


def run_case(spec: CaseSpec, backend: Backend, probes: Iterable[Probe] = (),
             inputs: CaseInputs | None = None, follow: Record | None = None) -> Record:
    """Run `spec` on `backend` from the seeded model and inputs (or `inputs`), following `follow` from the second
    iteration on (Trainer); never raises for the backend's faults. Records how often the backend compiled (thunder,
    torch.compile) as figure `compilations`, and what the run left in the process state (process_state.watched:
    restored before anything else runs)."""
    record = Record(backend=backend.name)
    with watched(record, spec):
        prepared = build_prepared(spec, backend, record)
        if prepared is None:
            return record
        model, fn = prepared
        run_prepared(fn, model, inputs or make_inputs(spec), spec, record, probes, follow)
        compiled = count_compilations(fn)
        if compiled is not None:
            record.figures["compilations"] = compiled
    return record
