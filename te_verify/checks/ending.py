"""How a run ended: completed every backward pass, or raised (which class, at which pass); and how far a replay's
gradients drifted from the first pass's.

`ending` is the check of it. A raise at pass k is the outcome of the passes from k on: the gradient checks still
compare the passes before it (`passes_compared`), so a known gap about a raise (TE issue 990) covers `ending` and
leaves the first pass's gradients judged."""
from __future__ import annotations

from te_verify.checks.verdict import Verdict
from te_verify.record import Record


def _describe(record: Record) -> str:
    if record.error is None:
        steps = len(record.steps)
        return f"completed {record.passes_done} backward pass(es)" + (f" and {steps} iterations" if steps > 1 else "")
    where = "before/at forward" if record.error_pass == 0 else f"at backward pass {record.error_pass}"
    if record.error_iteration > 1:
        where += f" of iteration {record.error_iteration}"
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


def ending_mismatch(ref: Record, got: Record) -> str | None:
    """None when both runs ended alike (both completed every pass, or raised the same class at the same pass);
    else what each did, e.g. "raised AttributeError at backward pass 2: ..., but eager completed 2 ..."."""
    same = (ref.error is None and got.error is None and len(ref.steps) == len(got.steps)) or (
        ref.error is not None and got.error is not None and type(ref.error) is type(got.error)
        and (ref.error_iteration, ref.error_pass) == (got.error_iteration, got.error_pass))
    if same:
        return None
    return f"{_describe(got)}, but {ref.backend} {_describe(ref)}" + (_drift_note(got) if ref.error is not None else "")


def passes_compared(ref: Record, got: Record) -> int:
    """How many backward passes of the first iteration both runs completed: the passes the gradient checks compare."""
    return min(ref.passes_done, got.passes_done)


def steps_compared(ref: Record, got: Record) -> int:
    """How many training iterations both runs completed, optimizer step included."""
    return min(len(ref.steps), len(got.steps))


def ending(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """The run ended as the reference's: both completed every pass, or both raised the same class at the same pass."""
    figures = {"passes_ref": ref.passes_done, "passes_got": got.passes_done, "iterations_ref": len(ref.steps),
               "iterations_got": len(got.steps), "ending_compared": "how both runs ended"}
    mismatch = ending_mismatch(ref, got)
    if mismatch is None:
        return Verdict("ending", True, figures=figures)
    return Verdict("ending", False, f"[{case_id}] backend {backend}: {mismatch}", figures)
