"""What a run produces besides gradients: its forward outputs, and the state it leaves in the model.

- output_parity: every forward output (warm-up steps, the measured forward, each microbatch) equals the
  reference's within the case's tolerance. A linear stack's gradients do not depend on the output's value under a
  fixed cotangent, so a wrong output is invisible to the gradient checks.
- state_left_behind: every parameter and buffer after the first iteration's backward passes (before its optimizer
  step) equals the reference's then: bitwise where the reference left it unchanged (no training step has run, so a
  backend must not write into them, e.g. a cast cache written back), else within the tolerance.
- params_after_steps: after every optimizer step, every parameter equals the reference's after the same step:
  within the case's bound (its fp64 truth's trajectory, or the tolerance) where the step moved it, bitwise where the
  reference's step left it as it was before that step (a frozen parameter; under a freeze schedule, one frozen now
  that trained before).
"""
from __future__ import annotations

import torch

from te_verify.checks.ending import steps_compared
from te_verify.checks.parity import compare_tensor, truth_problem
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.record import Record

BITWISE = Tolerance(0.0, 0.0, "the reference leaves it unchanged")


def output_parity(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance,
                  bound: TruthBound | None = None) -> Verdict:
    """Each forward output both runs produced matches (within `tol` of the reference's, or given a `bound`, within
    its factor of the reference's distance to the fp64 truth); a missing one is the ending check's job."""
    problems = []
    truths = bound.truth.outputs if bound is not None else []
    for k, (want, have) in enumerate(zip(ref.outputs, got.outputs), start=1):
        label = ref.output_label(k - 1)
        iteration = ref.output_iterations[k - 1] if k <= len(ref.output_iterations) else 1
        message = truth_problem(label, want, have, truths[k - 1], bound) if len(truths) >= k else \
            compare_tensor(label, want, have, tol.at(max(iteration, 1)))
        if message:
            problems.append(message)
    figures = {"outputs_compared": min(len(ref.outputs), len(got.outputs))}
    if problems:
        return Verdict("output_parity", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
    return Verdict("output_parity", True, figures=figures)


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], name: str) -> bool:
    return name not in after or not torch.equal(before[name], after[name])


def state_left_behind(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance) -> Verdict:
    """Parameters and buffers after the run equal the reference's after its run (see the module docstring)."""
    problems = []
    for name, want in ref.state_after.items():
        have = got.state_after.get(name)
        if have is None:
            if got.state_after:  # a run that never got to snapshot (raised early) has nothing to compare
                problems.append(f"{name}: missing after the run")
            continue
        bound = tol if _changed(ref.state_before, ref.state_after, name) else BITWISE
        message = compare_tensor(f"{name} after the run", want, have, bound)
        if message:
            problems.append(message + (" (written by the run; the reference leaves it unchanged)"
                                       if bound is BITWISE else ""))
    if problems:
        return Verdict("state_left_behind", False, f"[{case_id}] backend {backend}: " + "; ".join(problems))
    return Verdict("state_left_behind", True, figures={"state_tensors_compared": len(ref.state_after)})


def param_problem(label: str, want: torch.Tensor, have: torch.Tensor | None, unchanged: bool, tol: Tolerance,
                  truth: torch.Tensor | None = None, bound: TruthBound | None = None) -> str | None:
    """One parameter after a step against the reference's: bitwise where the reference left it `unchanged`, else
    within `bound` of the truth's trajectory (given `truth`) or within `tol`."""
    if have is None:
        return f"{label}: missing"
    if unchanged:
        if torch.equal(have.cpu(), want.cpu()):
            return None
        change = (have.double().cpu() - want.double().cpu()).abs().max().item()
        return f"{label}: changed, the reference's step left it unchanged (max abs change {change:.3g})"
    if truth is not None and bound is not None:
        return truth_problem(label, want, have, truth, bound)
    return compare_tensor(label, want, have, tol)


def params_after_steps(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance,
                       bound: TruthBound | None = None) -> Verdict:
    """Every parameter after each optimizer step both runs took against the reference's (module docstring)."""
    problems, compared = [], 0
    truth = bound.truth if bound is not None else None
    for k in range(steps_compared(ref, got)):
        want_step, have_step = ref.steps[k], got.steps[k]
        true_step = truth.steps[k] if truth is not None and len(truth.steps) > k else None
        for name, want in want_step.params.items():
            before = ref.steps[k - 1].params.get(name) if k else ref.state_before.get(f"param:{name}")
            unchanged = before is not None and torch.equal(before.cpu(), want.cpu())
            true = true_step.params.get(name) if true_step is not None else None
            problem = param_problem(f"{name} after step {want_step.iteration}", want, have_step.params.get(name),
                                    unchanged, tol.at(want_step.iteration), true, bound)
            compared += 1
            problems += [problem] if problem else []
    figures = {"steps_compared": steps_compared(ref, got), "params_compared": compared}
    if not compared and ref.steps:
        return not_observed("params_after_steps", case_id, backend, f"the run took no optimizer step, {ref.backend} "
                                                                    f"took {len(ref.steps)} (ending says how it ended)", figures)
    if problems:
        return Verdict("params_after_steps", False, f"[{case_id}] backend {backend}: parameters after the optimizer "
                       f"step differ from {ref.backend}'s: " + "; ".join(problems[:8])
                       + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""), figures, tuple(problems))
    return Verdict("params_after_steps", True, figures=figures)
