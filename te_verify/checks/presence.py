"""None-ness parity: a frozen parameter ends with grad None, a trainable one with a gradient."""
from __future__ import annotations

from te_verify.checks.verdict import Verdict
from te_verify.record import INPUT_GRAD, Record


def presence_problems(ref_grads: dict, got_grads: dict, pass_index: int = 1) -> list[str]:
    """Messages for every gradient that is None on one side only, after backward pass `pass_index`."""
    problems = []
    for name, ref_grad in ref_grads.items():
        got_grad = got_grads.get(name)
        what = "the model input" if name == INPUT_GRAD else name
        if ref_grad is None and got_grad is not None:
            problems.append(f"{what}: has a gradient after pass {pass_index}, expected None (frozen or not needed)")
        elif ref_grad is not None and got_grad is None:
            problems.append(f"{what}: gradient is None after pass {pass_index}, expected a gradient (trainable)")
    return problems


def grad_presence(case_id: str, backend: str, ref: Record, got: Record) -> Verdict:
    """Every gradient present in the reference is present in `got`, and every None stays None, after every pass both
    runs completed (how each ended is the `ending` check's)."""
    problems = []
    for k, (ref_grads, got_grads) in enumerate(zip(ref.grads, got.grads), start=1):
        problems = presence_problems(ref_grads, got_grads, k)
        if problems:
            break  # one pass is enough to name the fault
    if not problems:
        return Verdict("grad_presence", True)
    return Verdict("grad_presence", False, f"[{case_id}] backend {backend}: " + "; ".join(problems))
