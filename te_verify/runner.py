"""Run one case on one backend: build, freeze, prepare once, forward, k backward passes, under probes."""
from __future__ import annotations

import contextlib
from typing import Iterable

import torch

from te_verify.backends.base import Backend
from te_verify.backends.compilations import count_compilations
from te_verify.models import CaseInputs, build_model, freeze, frozen_at_backward, make_inputs, unfreeze_all
from te_verify.probes.base import Probe
from te_verify.probes.retention import Retention
from te_verify.process_state import watched
from te_verify.record import INPUT_GRAD, Record, TensorState
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
    """Run plain training steps (their outputs go to the record), then clear every gradient so the measured pass
    starts clean."""
    for _ in range(steps):
        out = fn(inputs.x)
        record.outputs.append(out.detach().clone())
        out.backward(inputs.grad_output)
    model.zero_grad(set_to_none=True)
    inputs.x.grad = None


def set_phase(probes: list[Probe], name: str, index: int = 0) -> None:
    for probe in probes:
        probe.phase(name, index)


def bind_probes(probes: list[Probe], model: torch.nn.Module) -> list[Probe]:
    """Probes that attribute work to layers learn the model's parameters (`bind`); returns `probes`."""
    for probe in probes:
        getattr(probe, "bind", lambda m: None)(model)
    return probes


def _measured_step(fn, model: torch.nn.Module, inputs: CaseInputs, spec: CaseSpec, record: Record,
                   probes: list[Probe]) -> torch.Tensor | None:
    """The probed forward and its `spec.replays` backward passes; returns the output (None if the forward raised)."""
    out, stage = None, 0
    with contextlib.ExitStack() as stack:
        for probe in probes:
            stack.enter_context(probe)
        try:
            set_phase(probes, "forward")
            out = fn(inputs.x)
            set_phase(probes, "idle")  # the harness's own copies are not the run's work or memory
            record.output = out.detach().clone()
            record.outputs.append(record.output)
            for k in range(1, spec.replays + 1):
                stage = k
                set_phase(probes, "backward", k)
                out.backward(inputs.grad_output, retain_graph=k < spec.replays)
                set_phase(probes, "idle")
                record.grads.append(snapshot_grads(model, inputs.x))
        except Exception as exc:  # a raise is an observation the replay check compares with eager's
            record.error, record.error_pass = exc, stage
    return out


def run_prepared(fn, model: torch.nn.Module, inputs: CaseInputs, spec: CaseSpec, record: Record,
                 probes: Iterable[Probe] = ()) -> Record:
    """Warm up (unprobed), forward once, then `spec.replays` backward passes (retain_graph on all but the last);
    record what the run left (state, requires_grad, the caller's tensors) and, for a probed run that completed, what
    a second step retains (probes.retention)."""
    probes = bind_probes(list(probes), model)
    record.inputs_before.update(input_states(inputs))
    try:
        warm_up(fn, model, inputs, spec.warmup_steps, record)
    except Exception as exc:
        record.error, record.error_pass = exc, 0
        return record
    with Retention(bool(probes)) as retention:  # entered first: on CPU it tracks from the measured step on
        out = _measured_step(fn, model, inputs, spec, record, probes)
        record.state_after = model_state(model)
        record.requires_grad_after = requires_grad_of(model)
        record.inputs_after.update(input_states(inputs))
        for probe in probes:
            record.figures.update(probe.figures())
            record.observations.update(probe.observations())
        if probes and record.error is None:
            del out  # the measured step's output and graph
            record.observations["retained"] = retention.second_step(fn, model, inputs)
            record.figures["retained_bytes"] = record.observations["retained"].get("bytes")
    return record


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


def run_fp64_eager(spec: CaseSpec) -> Record:
    """Eager on the case's model and inputs in fp64: the truth a model family's tolerance is derived from."""
    record = Record(backend="eager_fp64")
    model = frozen_at_backward(spec).double()
    inputs = make_inputs(spec)
    x = inputs.x.detach().double().requires_grad_(inputs.x.requires_grad) if inputs.x.is_floating_point() else inputs.x
    with watched(record):
        run_prepared(model, model, CaseInputs(x, inputs.grad_output.double()), spec, record)
    return record


def run_case(spec: CaseSpec, backend: Backend, probes: Iterable[Probe] = (),
             inputs: CaseInputs | None = None) -> Record:
    """Run `spec` on `backend` from the seeded model and inputs (or `inputs`); never raises for the backend's
    faults. Records how often the backend compiled (thunder, torch.compile) as figure `compilations`, and what the run
    left in the process state (process_state.watched: restored before anything else runs)."""
    record = Record(backend=backend.name)
    with watched(record, spec):
        prepared = build_prepared(spec, backend, record)
        if prepared is None:
            return record
        model, fn = prepared
        run_prepared(fn, model, inputs or make_inputs(spec), spec, record, probes)
        compiled = count_compilations(fn)
        if compiled is not None:
            record.figures["compilations"] = compiled
    return record
