"""Distributed parity: every rank's (gathered) gradients, forward output and parameters after the run equal
single-process eager's on the global batch.

A gradient that is None where eager has one fails (a run that leaves every gradient None never passes), and
so does a gradient where eager has None (a frozen parameter must end without one). Outputs and parameters are
compared rank by rank with the single-process checks (checks.state).
"""
from __future__ import annotations

from te_verify.checks.parity import grad_mismatches, worst_errors
from te_verify.checks.presence import presence_problems
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict, not_observed
from te_verify.record import Record


def dist_grad_parity(case_id: str, backend: str, ref: Record, ranks: list[Record], tol: Tolerance,
                     truth: dict | None = None, bound: TruthBound | None = None) -> Verdict:
    """Compare each rank's last-pass gradients with the eager reference's: within `tol`, or, given the fp64 `truth`
    gradients and a `bound` (a mixed-precision policy: distributed.precision), within the bound of the truth."""
    head = f"[{case_id}] backend {backend}"
    if ref.error is not None or not ref.grads:
        return Verdict("dist_grad_parity", False, f"{head}: eager reference did not complete: {ref.error!r}")
    problems, abs_err, rel_err = [], 0.0, 0.0
    for rank, got in enumerate(ranks):
        if got.error is not None or not got.grads:
            problems.append(f"rank {rank}: did not complete: {str(got.error).strip().splitlines()[-1:]}")
            continue
        found = presence_problems(ref.grads[-1], got.grads[-1]) + grad_mismatches(ref.grads[-1], got.grads[-1], tol, "",
                                                                                   truth, bound)
        problems += [f"rank {rank}: {p}" for p in found]
        a, r = worst_errors(ref.grads[-1], got.grads[-1])
        abs_err, rel_err = max(abs_err, a), max(rel_err, r)
    figures = {"max_abs_err": abs_err, "max_rel_err": rel_err, "rtol": tol.rtol, "atol": tol.atol,
               **({"tolerance": bound.source} if bound is not None else {}),
               "dist_grads_compared": sum(len(g.grads[-1]) for g in ranks if g.grads), "ranks_compared": len(ranks)}
    if not problems:
        return Verdict("dist_grad_parity", True, figures=figures)
    return Verdict("dist_grad_parity", False, f"{head}: gradients differ from eager on the global batch: "
                   + "; ".join(problems), figures)


def _per_rank(name: str, check, case_id: str, backend: str, ref: Record, ranks: list[Record], tol: Tolerance
              ) -> Verdict:
    """`check(case_id, label, ref, got, tol)` on every rank that completed, as one verdict naming failing ranks
    (a rank that did not complete is dist_grad_parity's to report)."""
    verdicts = [(rank, check(case_id, f"{backend} rank {rank}", ref, got, tol))
                for rank, got in enumerate(ranks) if got.error is None and got.grads]
    if not verdicts:  # nothing to compare is never a pass; dist_grad_parity names why the ranks did not complete
        return not_observed(name, case_id, backend, f"none of the {len(ranks)} ranks completed",
                            {"ranks_compared": 0}, blocked_by="dist_grad_parity")
    figures = {k: v for _, verdict in verdicts for k, v in verdict.figures.items()}
    problems = [verdict.message for _, verdict in verdicts if not verdict.ok]
    return Verdict(name, not problems, "\n".join(problems), figures)


def dist_output_parity(case_id: str, backend: str, ref: Record, ranks: list[Record], tol: Tolerance) -> Verdict:
    """Each rank's gathered forward output equals eager's on the global batch."""
    return _per_rank("dist_output_parity", output_parity, case_id, backend, ref, ranks, tol)


def dist_state_left_behind(case_id: str, backend: str, ref: Record, ranks: list[Record], tol: Tolerance) -> Verdict:
    """Each rank's full parameters after the run equal eager's (bitwise: no step runs, so nothing may change)."""
    return _per_rank("dist_state_left_behind", state_left_behind, case_id, backend, ref, ranks, tol)


def dist_schedule_parity(case_id: str, backend: str, want: list[dict], ranks: dict[int, tuple[list[dict], str | None]],
                         tol: Tolerance, truth: list[dict] | None = None, bound: TruthBound | None = None) -> Verdict:
    """Under a freeze schedule, each rank's gradients of every iteration after the first (`ranks[r]`: their list and
    what the wrapper raised, if it did) against eager's on the global batch (`want`: iterations 2, 3, ...; given their
    fp64 `truth` and a `bound`, within the bound of the truth): None-ness and values, naming the iteration, the rank and the parameter (a parameter a wrapper stopped reducing after a
    change is a rank-local gradient: its values differ)."""
    head = f"[{case_id}] backend {backend}: after a freeze schedule's change"
    problems, compared = [], 0
    for rank, (grads, error) in sorted(ranks.items()):
        if error is not None:
            problems.append(f"rank {rank}: raised at {error}")
        if len(grads) < len(want) and error is None:
            problems.append(f"rank {rank}: {len(grads)} iterations after the first, {len(want)} expected")
        for k, (ref, got) in enumerate(zip(want, grads), start=2):
            true = truth[k - 2] if truth is not None else None  # a mixed-precision policy's: fp64, its bound
            found = presence_problems(ref, got, f"iteration {k}") + grad_mismatches(ref, got, tol, f"iteration {k}:",
                                                                                    true, bound)
            problems += [f"rank {rank}: {p}" for p in found]
            compared += sum(1 for n, g in ref.items() if g is not None and got.get(n) is not None)
    figures = {"schedule_iterations_compared": len(want), "schedule_grads_compared": compared}
    if not want:
        return Verdict("dist_schedule_parity", False, f"{head}: nothing compared (the spec has no later iteration)",
                       figures)
    if problems:
        return Verdict("dist_schedule_parity", False, f"{head}: gradients differ from eager on the global batch: "
                       + "; ".join(problems), figures)
    return Verdict("dist_schedule_parity", True, figures=figures)
