"""Replay semantics: after every backward pass both runs completed (k passes with retain_graph=True), the
gradients equal the reference's. Whether both completed every pass, or raised alike, is the `ending` check's.
"""
from __future__ import annotations

from te_verify.checks.ending import replay_drift
from te_verify.checks.parity import grad_mismatches
from te_verify.checks.tolerances import Tolerance, TruthBound
from te_verify.checks.verdict import Verdict
from te_verify.record import Record


def replay_semantics(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance,
                     bound: TruthBound | None = None) -> Verdict:
    head = f"[{case_id}] backend {backend}"
    figures = {"passes_ref": ref.passes_done, "passes_got": got.passes_done, "replay_drift": replay_drift(got),
               "replay_passes_compared": min(ref.passes_done, got.passes_done)}
    for k, (ref_grads, got_grads) in enumerate(zip(ref.grads, got.grads), start=1):
        truth = bound.truth.grads[k - 1] if bound is not None and len(bound.truth.grads) >= k else None
        problems = grad_mismatches(ref_grads, got_grads, tol, f"replay {k}:", truth, bound)
        if problems:
            return Verdict("replay", False, f"{head}: differs from {ref.backend} after backward pass {k}: "
                           + "; ".join(problems), figures)
    return Verdict("replay", True, figures=figures)
