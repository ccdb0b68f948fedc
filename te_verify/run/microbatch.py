"""Drive a spec over its microbatches (a TE-lane spec's te.microbatches, else CaseSpec.microbatches: forward,
backward, backward_dw when delayed; interleaved, or every forward first: `accumulation`) on any backend, and observe
what the weight-gradient contract is about: param.grad after each microbatch, main_grad at the end (and whether a delayed backward() touched it), grad_added_to_main_grad, and
how often autograd accumulated into .grad.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import torch

from te_verify.models import CaseInputs, make_inputs
from te_verify.probes import dispatch
from te_verify.run.iteration_probes import IterationProbes
from te_verify.run.process_state import watched
from te_verify.record import Record
from te_verify.run.runner import (Trainer, bind_probes, build_prepared, host_copies, input_states, iteration_batches,
                              model_state, requires_grad_of, run_case, set_phase, snapshot_grads, watching)
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


def accumulation(spec: CaseSpec) -> tuple[int, str]:
    """(microbatches, order) of a case: the TE lane's te.microbatches/te.accumulation, else CaseSpec's."""
    if spec.te is not None:
        return spec.te.microbatches, spec.te.accumulation
    return spec.microbatches, spec.accumulation


def delays_wgrad(spec: CaseSpec) -> bool:
    return spec.te is not None and spec.te.delay_wgrad


def takes_first_microbatch(fn) -> bool:
    """Whether the backend's callable takes TE's is_first_microbatch (a TE stack does; eager's model does not)."""
    forward = getattr(fn, "forward", fn)
    try:
        return "is_first_microbatch" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


class MicrobatchTrainer:
    """The microbatch families' training: each iteration runs every microbatch's forward (TE's is_first_microbatch
    True on the first, False after, as Megatron passes it: the FP8 weight copy is made once per optimizer step),
    backward and backward_dw (delayed), then the optimizer step (training.optimizer_step: on main_grad where it is
    kept); from the second iteration on the parameters and momentum start from `follow`'s (runner.Trainer)."""

    def __init__(self, spec: CaseSpec, fn, model: torch.nn.Module, record: Record, dtype: torch.dtype | None,
                 follow: Record | None, watchers: list = ()) -> None:
        self.spec, self.fn, self.model, self.record = spec, fn, model, record
        self.count, self.order = accumulation(spec)
        batches = [_cast(make_inputs(spec.replace(seed=spec.seed + 1000 * k)), dtype) for k in range(self.count)]
        # Each iteration its own copies of the microbatches (runner.iteration_batches); the first are the caller's.
        self.per_iteration = list(zip(*(iteration_batches(b, spec.iterations) for b in batches)))
        self.first_flag = takes_first_microbatch(fn)
        record.observations["is_first_microbatch"] = self.first_flag and self.count > 1
        self.trainer = Trainer(fn, model, spec, record, follow, watchers=watchers)
        # The waste probes of the iteration running, told every pass: ("forward", m), ("backward", m) for microbatch m.
        self.labels: list = []

    def iteration(self, k: int, watch: "ContractWatch | None" = None) -> None:
        """Iteration k: every microbatch's forward, backward and backward_dw, each backward right after its forward
        or (accumulation "forwards_first") every forward first, the backwards then in the same order; `watch`
        observes the first iteration."""
        if k > 1:
            self.trainer.follow_reference(k)
        batches = list(enumerate(self.per_iteration[k - 1]))
        if self.order == "forwards_first":  # several forwards' graphs alive at once
            outs = [self._forward(k, m, inputs) for m, inputs in batches]
            for (m, inputs), out in zip(batches, outs):
                self._backward(m, inputs, out, watch)
        else:
            for m, inputs in batches:
                self._backward(m, inputs, self._forward(k, m, inputs), watch)

    def _forward(self, k: int, m: int, inputs: CaseInputs) -> torch.Tensor:
        self.trainer.hear("forward")
        set_phase(self.labels, "forward", m + 1)  # the microbatch: its forward is judged with its backward
        out = self.fn(inputs.x, is_first_microbatch=m == 0) if self.first_flag else self.fn(inputs.x)
        set_phase(self.labels, "idle")
        self.record.add_output(out, f"iteration {k}, microbatch {m + 1}" if self.spec.iterations > 1
                               else f"microbatch {m + 1}", k, host=k > 1)
        return out

    def _backward(self, m: int, inputs: CaseInputs, out: torch.Tensor, watch: "ContractWatch | None") -> None:
        if watch is not None:
            watch.before_backward()
        self.trainer.hear("backward", m + 1)
        set_phase(self.labels, "backward", m + 1)
        out.backward(inputs.grad_output)
        set_phase(self.labels, "idle")
        if watch is not None:
            watch.after_backward(m)
        if hasattr(self.fn, "backward_dw") and delays_wgrad(self.spec):
            set_phase(self.labels, "backward", m + 1)  # the delayed wgrad GEMMs are this microbatch's backward work
            self.fn.backward_dw()
            set_phase(self.labels, "idle")
        if watch is not None:
            watch.after_microbatch(inputs)

    def step(self, k: int) -> None:
        """The optimizer step ending iteration k (its gradients those after the last microbatch)."""
        last = self.per_iteration[k - 1][-1].x
        grads = self.record.grads[-1] if k == 1 else host_copies(snapshot_grads(self.model, last))
        self.trainer.step(k, grads)
        if k > 1:
            for inputs in self.per_iteration[k - 1]:
                inputs.x.grad = None

    def inputs_states(self) -> dict:
        """Every iteration's microbatches as they are now, labelled by microbatch (and iteration after the first)."""
        states = {}
        for k, batches in enumerate(self.per_iteration, start=1):
            for m, inputs in enumerate(batches):
                states.update(input_states(inputs, f" of microbatch {m + 1}" + (f" (iteration {k})" if k > 1 else "")))
        return states


class ContractWatch:
    """What the weight-gradient contract is about, over the first iteration's microbatches (WeightObservation)."""

    def __init__(self, spec: CaseSpec, model: torch.nn.Module, record: Record) -> None:
        self.spec, self.model, self.record = spec, model, record
        self.weights = {n: p for n, p in model.named_parameters() if n.endswith("weight") and p.requires_grad}
        self.obs = {n: WeightObservation() for n in self.weights}
        self.hooks = [p.register_post_accumulate_grad_hook(lambda q, o=self.obs[n]: _count_write(q, o))
                      for n, p in self.weights.items()]
        self.before: dict[str, torch.Tensor] = {}

    def before_backward(self) -> None:
        self.before = _main_grads(self.weights) if delays_wgrad(self.spec) else {}

    def after_backward(self, m: int) -> None:
        for n, main_grad in self.before.items():
            if not torch.equal(main_grad, self.weights[n].main_grad):
                self.obs[n].main_grad_before_dw.append(m + 1)

    def after_microbatch(self, inputs: CaseInputs) -> None:
        self.record.grads.append(snapshot_grads(self.model, inputs.x))
        for n, p in self.weights.items():
            self.obs[n].grad_kinds.append(classify(p))

    def finish(self) -> None:
        """main_grad and the Megatron flag as the microbatches left them (before the optimizer step zeroes them)."""
        for n, p in self.weights.items():
            self.obs[n].main_grad = p.main_grad.detach().clone() if hasattr(p, "main_grad") else None
            self.obs[n].grad_added = getattr(p, "grad_added_to_main_grad", None)
        for hook in self.hooks:
            hook.remove()
        self.record.observations["te_contract"] = self.obs


def run_microbatches(spec: CaseSpec, backend, probes=(), dtype: torch.dtype | None = None,
                     follow: Record | None = None) -> Record:
    """Run spec.iterations iterations of the microbatches (seeds spec.seed + 1000*k for inputs): the first one's
    grads snapshot after each microbatch, under the probes, with the contract's observations; each iteration's
    optimizer step recorded as a Step. `dtype` casts each input and cotangent (an fp64 truth). What the run left in
    the process state goes to the record, restored (process_state.watched)."""
    record = Record(backend=backend.name)
    with watched(record, spec):
        _run_microbatches(spec, backend, probes, dtype, record, follow)
    return record


def _run_microbatches(spec: CaseSpec, backend, probes, dtype: torch.dtype | None, record: Record,
                      follow: Record | None) -> Record:
    prepared = build_prepared(spec, backend, record)
    if prepared is None:
        return record
    model, fn = prepared
    watchers = bind_probes([p for p in probes if getattr(p, "spans_iterations", False)], model)
    probes = [p for p in probes if p not in watchers]
    with watching(watchers, fn, record):
        _train_microbatches(spec, fn, model, record, probes, dtype, follow, watchers)
    return record


def _train_microbatches(spec: CaseSpec, fn, model: torch.nn.Module, record: Record, probes: list,
                        dtype: torch.dtype | None, follow: Record | None, watchers: list) -> None:
    trainer = MicrobatchTrainer(spec, fn, model, record, dtype, follow, watchers)
    record.inputs_before.update(trainer.inputs_states())
    with dispatch.session(bool(probes)):  # one watcher over every iteration, from after the batches were made
        _probed_iterations(spec, trainer, model, record, probes)
    record.requires_grad_after = requires_grad_of(model)
    record.inputs_after.update(trainer.inputs_states())


def _probed_iterations(spec: CaseSpec, trainer: MicrobatchTrainer, model: torch.nn.Module, record: Record,
                       probes: list) -> None:
    """The first iteration under `probes` with the contract's observations, then the later ones (each probed)."""
    watch = ContractWatch(spec, model, record)
    trainer.labels = bind_probes(probes, model)  # each pass labelled with its microbatch (checks.accumulation)
    for probe in probes:
        probe.__enter__()
        probe.phase("idle")
    try:
        trainer.iteration(1, watch)
    except Exception as exc:
        record.error, record.error_pass = exc, len(record.grads) + 1
    trainer.labels = []
    for probe in probes:
        probe.__exit__(None, None, None)
        record.figures.update(probe.figures())
        record.observations.update(probe.observations())
    record.state_after = model_state(model)
    watch.finish()
    _later_iterations(trainer, record, IterationProbes.like(probes, model, record))


def _later_iterations(trainer: MicrobatchTrainer, record: Record, later: IterationProbes) -> None:
    """The first iteration's optimizer step, then iterations 2..spec.iterations, each under fresh waste probes
    (`later`: Record.later, judged by checks.iterations); a raise ends the run there."""
    if record.error is not None:
        return
    k = 1
    try:
        trainer.step(1)
        for k in range(2, trainer.spec.iterations + 1):
            with later.around(k) as trainer.labels:
                trainer.iteration(k)
            trainer.labels = []
            trainer.step(k)
    except Exception as exc:
        record.error, record.error_pass, record.error_iteration = exc, trainer.count, k


def _cast(inputs: CaseInputs, dtype: torch.dtype | None) -> CaseInputs:
    """The input and cotangent in `dtype` (None: as made); the input keeps whether it needs a gradient."""
    if dtype is None:
        return inputs
    x = inputs.x
    x = x.detach().to(dtype).requires_grad_(x.requires_grad) if x.is_floating_point() else x
    return CaseInputs(x, inputs.grad_output.to(dtype))


def run_mean_reduced(spec: CaseSpec, backend, probes=(), dtype: torch.dtype | None = None,
                     follow: Record | None = None) -> Record:
    """run_case with the cotangent of a mean-reduced loss (grad_output / rows), so gradients are O(1) as in
    training and comparable with FP8's absolute tolerance; `dtype` casts the input and cotangent (an fp64 truth);
    following `follow` from the second iteration on (runner.Trainer)."""
    inputs = make_inputs(spec)
    rows = math.prod(spec.batch_shape)
    return run_case(spec, backend, probes, inputs=_cast(CaseInputs(inputs.x, inputs.grad_output / rows), dtype),
                    follow=follow)
