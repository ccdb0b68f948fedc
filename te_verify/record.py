"""What one run of a case on one backend leaves behind: outputs, gradients per backward pass, figures."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

INPUT_GRAD = "<input>"  # key of the model input's gradient in Record.grads


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    """What a tensor is besides its values, as the checks of what a step leaves compare it (checks.leftovers)."""
    return {"dtype": t.dtype, "shape": tuple(t.shape), "device": t.device, "layout": t.layout}


@dataclass(frozen=True)
class TensorState:
    """A caller's tensor at one moment: its values (a detached copy) and metadata, requires_grad included."""

    values: torch.Tensor
    meta: dict[str, Any]

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorState":
        return cls(t.detach().clone(), {**tensor_meta(t), "requires_grad": t.requires_grad})


@dataclass
class Step:
    """What one training iteration leaves to be judged (te_verify.training), on the host."""

    # The iteration, 1-based (1 is the probed one).
    iteration: int
    # Gradients after the iteration's last backward pass (or microbatch), before the optimizer step, by qualified
    # parameter name (INPUT_GRAD for the input); None where the gradient is None.
    grads: dict[str, torch.Tensor | None]
    # Every parameter after the optimizer step, by qualified name.
    params: dict[str, torch.Tensor]
    # What each check of the step's own state reads (e.g. "fp8_state": FP8 scaling state after the step).
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Record:
    """The observable result of a run; checks are pure functions of records."""

    # Backend name that produced this record.
    backend: str
    # Forward output, detached (None if the forward raised).
    output: torch.Tensor | None = None
    # Every forward output of the run, in order: warm-up steps, then each iteration's (each microbatch's).
    outputs: list[torch.Tensor] = field(default_factory=list)
    # What each output is, for failure messages: "warm-up step 1", "iteration 2", "iteration 1, microbatch 2".
    output_labels: list[str] = field(default_factory=list)
    # The iteration each output belongs to (0 for a warm-up step).
    output_iterations: list[int] = field(default_factory=list)
    # The model's parameters and buffers ("param:<name>", "buffer:<name>") before the backend ran and after the
    # last backward pass: what the run left behind (a backend must not write into them).
    state_before: dict[str, torch.Tensor] = field(default_factory=dict)
    state_after: dict[str, torch.Tensor] = field(default_factory=dict)
    # Every parameter's requires_grad after the last backward pass, by qualified name.
    requires_grad_after: dict[str, bool] = field(default_factory=dict)
    # The caller's tensors (the input x, the output cotangent; per microbatch where there are several) before the
    # backend saw them and after the last backward pass: a backend must leave them as it found them.
    inputs_before: dict[str, TensorState] = field(default_factory=dict)
    inputs_after: dict[str, TensorState] = field(default_factory=dict)
    # grads[k] = gradients after backward pass k+1 (or microbatch k+1) of the first iteration, by qualified
    # parameter name (INPUT_GRAD for the input); None where the gradient is None.
    grads: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    # Every training iteration that completed its optimizer step, in order (te_verify.training).
    steps: list[Step] = field(default_factory=list)
    # The learning rate its optimizer stepped with (training.first_step_lr; a run following a reference takes the
    # reference's); None before the first step.
    lr: float | None = None
    # The exception that ended the run early, if any.
    error: BaseException | None = None
    # Where it was raised: 0 = building/preparing/forward, k >= 1 = k-th backward pass (or microbatch) of the
    # iteration `error_iteration` (1-based; 1 for a raise before the first optimizer step).
    error_pass: int | None = None
    error_iteration: int = 1
    # Probe figures and backend figures (compilations, GEMM log summary, ...), JSON-serialisable.
    figures: dict[str, Any] = field(default_factory=dict)
    # Raw probe observations that checks read (e.g. GEMM events); not written to the report.
    observations: dict[str, Any] = field(default_factory=dict)
    # Each later iteration's probe figures and observations, by iteration (2, 3, ...): the waste checks judge every
    # iteration as they judge the first (checks.iterations); only iterations that completed, only in a probed run.
    later: dict[int, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    # What the run left changed in the process state, one message per setting ("left grad mode disabled"), each
    # restored before anything else ran (te_verify.run.process_state.watched); None where the run was not watched.
    process_left: list[str] | None = None
    # How many process settings were compared before and after the run (0 where not watched).
    process_compared: int = 0

    @property
    def passes_done(self) -> int:
        return len(self.grads)

    def add_output(self, out: torch.Tensor, label: str, iteration: int, host: bool = False) -> torch.Tensor:
        """Keep a detached copy of a forward output of `iteration` under `label` (on the host with `host`); returns
        the copy."""
        kept = out.detach().to("cpu", copy=True) if host else out.detach().clone()
        self.outputs.append(kept)
        self.output_labels.append(label)
        self.output_iterations.append(iteration)
        return kept

    def at_iteration(self, k: int) -> "Record":
        """This record as the waste checks see iteration k >= 2: that iteration's probe figures (over the run's own
        figures) and observations, no error (only completed iterations are kept)."""
        figures, observations = self.later[k]
        return dataclasses.replace(self, figures={**self.figures, **figures}, observations=dict(observations),
                                   error=None, error_pass=None, error_iteration=1, later={})

    def output_label(self, k: int) -> str:
        """The label of output k (0-based): "forward output (iteration 2)"."""
        if len(self.outputs) == 1:
            return "forward output"
        label = self.output_labels[k] if k < len(self.output_labels) else f"{k + 1} of {len(self.outputs)}"
        return f"forward output ({label})"
