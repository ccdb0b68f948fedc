"""Drive a TE-lane spec over `spec.te.microbatches` microbatches (forward, backward, backward_dw when
delayed) on any backend, and observe what the weight-gradient contract is about: param.grad after each
microbatch, main_grad at the end (and whether a delayed backward() touched it), grad_added_to_main_grad, and
how often autograd accumulated into .grad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from te_verify.models import CaseInputs, make_inputs
from te_verify.process_state import watched
from te_verify.record import Record
from te_verify.runner import build_prepared, input_states, model_state, requires_grad_of, run_case, snapshot_grads
from te_verify.spec import CaseSpec


@dataclass
class WeightObservation:
    """What happened to one trainable weight over the microbatches."""

    # Classification of .grad after each microbatch: "none", "dummy" (all zero with the Megatron flag) or "wgrad".
    grad_kinds: list[str] = field(default_factory=list)
    # Number of times autograd's AccumulateGrad wrote into .grad.
    accumulations: int = 0
    # main_grad at the end (None without fuse_wgrad_accumulation).
    main_grad: torch.Tensor | None = None
    # grad_added_to_main_grad at the end (None when the attribute is absent).
    grad_added: bool | None = None
    # Microbatches (1-based) whose backward() changed main_grad although delay_wgrad_compute leaves the wgrad to
    # backward_dw() (watched only for delayed, fused cases).
    main_grad_before_dw: list[int] = field(default_factory=list)


def classify(p: torch.nn.Parameter) -> str:
    if p.grad is None:
        return "none"
    if getattr(p, "grad_added_to_main_grad", False) and not p.grad.any():
        return "dummy"
    return "wgrad"


def _count_write(p: torch.nn.Parameter, obs: WeightObservation) -> None:
    """AccumulateGrad also runs (and fires the hook) when backward returned None; count real writes only."""
    if p.grad is not None:
        obs.accumulations += 1


def _main_grads(weights: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.detach().clone() for n, p in weights.items() if hasattr(p, "main_grad")}


def run_microbatches(spec: CaseSpec, backend, probes=(), dtype: torch.dtype | None = None) -> Record:
    """Run the microbatches (seeds spec.seed + 1000*k for inputs); grads snapshot after each one. `dtype` casts each
    input and cotangent (an fp64 truth). What the run left in the process state goes to the record, restored
    (process_state.watched)."""
    record = Record(backend=backend.name)
    with watched(record, spec):
        _run_microbatches(spec, backend, probes, dtype, record)
    return record


def _run_microbatches(spec: CaseSpec, backend, probes, dtype: torch.dtype | None, record: Record) -> Record:
    prepared = build_prepared(spec, backend, record)
    if prepared is None:
        return record
    model, fn = prepared
    weights = {n: p for n, p in model.named_parameters() if n.endswith("weight") and p.requires_grad}
    obs = {n: WeightObservation() for n in weights}
    for n, p in weights.items():
        p.register_post_accumulate_grad_hook(lambda q, o=obs[n]: _count_write(q, o))
    for probe in probes:
        probe.__enter__()
    try:
        for k in range(spec.te.microbatches):
            inputs = _cast(make_inputs(spec.replace(seed=spec.seed + 1000 * k)), dtype)
            record.inputs_before.update(input_states(inputs, f" of microbatch {k + 1}"))
            for probe in probes:
                probe.phase("backward", k + 1)
            out = fn(inputs.x)
            record.outputs.append(out.detach().clone())
            before = _main_grads(weights) if spec.te.delay_wgrad else {}
            out.backward(inputs.grad_output)
            for n, main_grad in before.items():
                if not torch.equal(main_grad, weights[n].main_grad):
                    obs[n].main_grad_before_dw.append(k + 1)
            if hasattr(fn, "backward_dw") and spec.te.delay_wgrad:
                fn.backward_dw()
            record.grads.append(snapshot_grads(model, inputs.x))
            record.inputs_after.update(input_states(inputs, f" of microbatch {k + 1}"))
            for n, p in weights.items():
                obs[n].grad_kinds.append(classify(p))
    except Exception as exc:
        record.error, record.error_pass = exc, len(record.grads) + 1
    for probe in probes:
        probe.__exit__(None, None, None)
        record.observations.update(probe.observations())
    record.state_after = model_state(model)
    record.requires_grad_after = requires_grad_of(model)
    for n, p in weights.items():
        obs[n].main_grad = p.main_grad.detach().clone() if hasattr(p, "main_grad") else None
        obs[n].grad_added = getattr(p, "grad_added_to_main_grad", None)
    record.observations["te_contract"] = obs
    return record


def _cast(inputs: CaseInputs, dtype: torch.dtype | None) -> CaseInputs:
    """The input and cotangent in `dtype` (None: as made); the input keeps whether it needs a gradient."""
    if dtype is None:
        return inputs
    x = inputs.x
    x = x.detach().to(dtype).requires_grad_(x.requires_grad) if x.is_floating_point() else x
    return CaseInputs(x, inputs.grad_output.to(dtype))


def run_mean_reduced(spec: CaseSpec, backend, probes=(), dtype: torch.dtype | None = None) -> Record:
    """run_case with the cotangent of a mean-reduced loss (grad_output / rows), so gradients are O(1) as in
    training and comparable with FP8's absolute tolerance; `dtype` casts the input and cotangent (an fp64 truth)."""
    inputs = make_inputs(spec)
    rows = math.prod(spec.batch_shape)
    return run_case(spec, backend, probes, inputs=_cast(CaseInputs(inputs.x, inputs.grad_output / rows), dtype))
