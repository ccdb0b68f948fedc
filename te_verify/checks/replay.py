"""Replay semantics: k backward passes with retain_graph=True end as eager's do.

Both complete with equal gradients after every pass, or both raise the same exception class at the same pass.
"""
from __future__ import annotations

from te_verify.checks.parity import grad_mismatches
from te_verify.checks.tolerances import Tolerance
from te_verify.checks.verdict import Verdict
from te_verify.record import Record


def _describe(record: Record) -> str:
    if record.error is None:
        return f"completed {record.passes_done} backward pass(es)"
    where = "before/at forward" if record.error_pass == 0 else f"at backward pass {record.error_pass}"
    return f"raised {type(record.error).__name__} {where}: {str(record.error).splitlines()[0][:200] if str(record.error) else ''}"


def replay_drift(record: Record) -> float | None:
    """How far the 2nd backward pass's contribution is from the 1st's: max over gradients of
    ||(g2 - g1) - g1|| / ||g1|| (0.0 when a replay adds exactly what the first pass did)."""
    if record.passes_done < 2:
        return None
    first, second = record.grads[0], record.grads[1]
    drifts = [float(((second[n] - first[n]) - first[n]).double().norm() / first[n].double().norm())
              for n in first if first[n] is not None and second.get(n) is not None and first[n].double().norm() > 0]
    return round(max(drifts), 4) if drifts else None


def _drift_note(record: Record) -> str:
    drift = replay_drift(record)
    return "" if drift is None else f"; its 2nd pass added gradients {drift:.1%} away from its 1st (norm-relative)"


def replay_semantics(case_id: str, backend: str, ref: Record, got: Record, tol: Tolerance) -> Verdict:
    head = f"[{case_id}] backend {backend}"
    figures = {"passes_ref": ref.passes_done, "passes_got": got.passes_done, "replay_drift": replay_drift(got)}
    if (ref.error is None) != (got.error is None):
        return Verdict("replay", False, f"{head}: {_describe(got)}, but {ref.backend} {_describe(ref)}"
                       + (_drift_note(got) if ref.error is not None else ""), figures)
    if ref.error is not None:
        same = type(ref.error) is type(got.error) and ref.error_pass == got.error_pass
        if not same:
            return Verdict("replay", False, f"{head}: {_describe(got)}, but {ref.backend} {_describe(ref)}", figures)
    for k, (ref_grads, got_grads) in enumerate(zip(ref.grads, got.grads), start=1):
        problems = grad_mismatches(ref_grads, got_grads, tol, f"replay {k}:")
        if problems:
            return Verdict("replay", False, f"{head}: differs from {ref.backend} after backward pass {k}: "
                           + "; ".join(problems), figures)
    return Verdict("replay", True, figures=figures)
