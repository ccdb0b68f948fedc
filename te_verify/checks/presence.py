"""None-ness parity: a frozen parameter ends with grad None, a trainable one with a gradient, after every backward
pass of the first iteration and after every later iteration."""
from __future__ import annotations

from te_verify.checks.parity import compared_nothing
from te_verify.checks.verdict import Verdict
from te_verify.record import INPUT_GRAD, Record


def presence_problems(ref_grads: dict, got_grads: dict, pass_index: int | str = 1) -> list[str]:
    """Messages for every gradient that is None on one side only, after backward pass `pass_index` (or the named
    point, e.g. "iteration 2")."""
    problems = []
    when = f"pass {pass_index}" if isinstance(pass_index, int) else pass_index
    for name, ref_grad in ref_grads.items():
        got_grad = got_grads.get(name)
        what = "the model input" if name == INPUT_GRAD else name
        if ref_grad is None and got_grad is not None:
            problems.append(f"{what}: has a gradient after {when}, expected None (frozen or not needed)")
        elif ref_grad is not None and got_grad is None:
            problems.append(f"{what}: gradient is None after {when}, expected a gradient (trainable)")
    return problems


def grad_presence(case_id: str, backend: str, ref: Record, got: Record, suffix: str = "") -> Verdict:
    """Every gradient present in the reference is present in `got`, and every None stays None, after every pass both
    runs completed (how each ended is the `ending` check's). `suffix`: only the parameters whose names end with it
    (".bias" in te_contract, where a weight's .grad is the return contract's: None or a dummy under main_grad)."""
    pick = lambda grads: {n: g for n, g in grads.items() if n.endswith(suffix)}  # noqa: E731
    points = [(k, pick(r), pick(g)) for k, (r, g) in enumerate(zip(ref.grads, got.grads), start=1)]
    points += [(f"iteration {r.iteration}", pick(r.grads), pick(g.grads)) for r, g in zip(ref.steps[1:], got.steps[1:])]
    problems = []
    for when, ref_grads, got_grads in points:
        problems = presence_problems(ref_grads, got_grads, when)
        if problems:
            break  # one pass is enough to name the fault
    figures = {"presence_points_compared": len(points)}
    if not points:
        nothing = compared_nothing("grad_presence", case_id, backend, ref, got)
        if nothing is not None:
            return nothing
    if not problems:
        return Verdict("grad_presence", True, figures=figures)
    return Verdict("grad_presence", False, f"[{case_id}] backend {backend}: " + "; ".join(problems), figures)
