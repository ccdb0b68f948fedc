"""What a run produces besides gradients: its forward outputs, and the state it leaves in the model.

- output_parity: every forward output (warm-up steps, the measured forward, each microbatch) equals the
  reference's within the case's tolerance. A linear stack's gradients do not depend on the output's value under a
  fixed cotangent, so a wrong output is invisible to the gradient checks.
- state_left_behind: every parameter and buffer after the run equals the reference's after its run: bitwise where
  the reference left it unchanged (no training step runs here, so a backend must not write into them, e.g. a cast
  cache written back), else within the tolerance.
"""
from __future__ import annotations

import torch

from te_verify.checks.parity import compare_tensor, truth_problem
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict
from te_verify.record import Record

BITWISE = Tolerance(0.0, 0.0, "the reference leaves it unchanged")


def output_parity(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance,
                  bound: TruthBound | None = None) -> Verdict:
    """Each forward output both runs produced matches (within `tol` of the reference's, or given a `bound`, within
    its factor of the reference's distance to the fp64 truth); a missing one is the ending check's job."""
    problems = []
    truths = bound.truth.outputs if bound is not None else []
    for k, (want, have) in enumerate(zip(ref.outputs, got.outputs), start=1):
        label = "forward output" if len(ref.outputs) == 1 else f"forward output {k} of {len(ref.outputs)}"
        message = truth_problem(label, want, have, truths[k - 1], bound) if len(truths) >= k else \
            compare_tensor(label, want, have, tol)
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
