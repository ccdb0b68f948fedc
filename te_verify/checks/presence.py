"""None-ness parity: a frozen parameter ends with grad None, a trainable one with a gradient."""
from __future__ import annotations

from te_verify.checks.verdict import Verdict
from te_verify.record import INPUT_GRAD, Record


def grad_presence(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """Every gradient present in the reference is present in `got`, and every None stays None."""
    if not ref.grads or not got.grads:
        return Verdict("grad_presence", True)
    problems = []
    for k, (ref_grads, got_grads) in enumerate(zip(ref.grads, got.grads), start=1):
        for name, ref_grad in ref_grads.items():
            got_grad = got_grads.get(name)
            what = "the model input" if name == INPUT_GRAD else name
            if ref_grad is None and got_grad is not None:
                problems.append(f"{what}: has a gradient after pass {k}, expected None (frozen or not needed)")
            elif ref_grad is not None and got_grad is None:
                problems.append(f"{what}: gradient is None after pass {k}, expected a gradient (trainable)")
        if problems:
            break  # one pass is enough to name the fault
    if not problems:
        return Verdict("grad_presence", True)
    return Verdict("grad_presence", False, f"[{case_id}] backend {backend}: " + "; ".join(problems))
