"""Distributed gradient parity: every rank's (gathered) gradients equal single-process eager on the global batch.

A gradient that is None where eager has one fails (a run that leaves every gradient None never passes), and
so does a gradient where eager has None (a frozen parameter must end without one).
"""
from __future__ import annotations

from te_verify.checks.parity import grad_mismatches, worst_errors
from te_verify.checks.presence import presence_problems
from te_verify.checks.tolerances import Tolerance
from te_verify.checks.verdict import Verdict
from te_verify.record import Record


def dist_grad_parity(case_id: str, backend: str, ref: Record, ranks: list[Record], tol: Tolerance) -> Verdict:
    """Compare each rank's last-pass gradients with the eager reference's."""
    head = f"[{case_id}] backend {backend}"
    if ref.error is not None or not ref.grads:
        return Verdict("dist_grad_parity", False, f"{head}: eager reference did not complete: {ref.error!r}")
    problems, abs_err, rel_err = [], 0.0, 0.0
    for rank, got in enumerate(ranks):
        if got.error is not None or not got.grads:
            problems.append(f"rank {rank}: did not complete: {str(got.error).strip().splitlines()[-1:]}")
            continue
        found = presence_problems(ref.grads[-1], got.grads[-1]) + grad_mismatches(ref.grads[-1], got.grads[-1], tol, "")
        problems += [f"rank {rank}: {p}" for p in found]
        a, r = worst_errors(ref.grads[-1], got.grads[-1])
        abs_err, rel_err = max(abs_err, a), max(rel_err, r)
    figures = {"max_abs_err": abs_err, "max_rel_err": rel_err, "rtol": tol.rtol, "atol": tol.atol}
    if not problems:
        return Verdict("dist_grad_parity", True, figures=figures)
    return Verdict("dist_grad_parity", False, f"{head}: gradients differ from eager on the global batch: "
                   + "; ".join(problems), figures)
