"""The waste checks at every iteration: a check judged on the first iteration's probe record is judged on each later
iteration's (Record.later, run.iteration_probes) the same way, against the oracle's required work for that iteration
(a freeze schedule's change before it: models.schedule.spec_at), and one verdict per check says where it failed:
"iteration 2: ..." (the value checks' way of naming an iteration). A backend that wastes only after an optimizer step
(a recompile that lost a specialisation) fails by the iteration it wasted in."""
from __future__ import annotations

import dataclasses
from typing import Callable

from te_verify.checks.verdict import Verdict
from te_verify.models.schedule import spec_at
from te_verify.record import Record
from te_verify.spec import CaseSpec

ITERATIONS_FIGURE = "waste_iterations_judged"


def judged_iterations(*records: Record) -> list[int]:
    """The later iterations every record has probe figures of and completed (a raise in iteration k: ending's)."""
    common = set.intersection(*(set(r.later) for r in records)) if records else set()
    return sorted(k for k in common if all(r.error is None or r.error_iteration > k for r in records))


def _prefixed(verdict: Verdict, k: int, spec: CaseSpec, spec_k: CaseSpec) -> Verdict:
    """`verdict` of iteration k with its message and problems named by iteration (and the case's own id)."""
    def name(text: str) -> str:
        return f"iteration {k}: " + (text.replace(spec_k.id, spec.id) if spec_k is not spec else text)
    return dataclasses.replace(verdict, message=name(verdict.message) if verdict.message else "",
                               problems=tuple(name(p) for p in verdict.problems))


def _merge(first: list[Verdict], later: list[Verdict]) -> list[Verdict]:
    """Iteration 1's verdicts with a later iteration's failures joined in, check by check (a check only a later
    iteration ran is added)."""
    merged = {v.check: v for v in first}
    for v in later:
        base = merged.get(v.check)
        if base is None:
            merged[v.check] = v
        elif not v.ok:
            merged[v.check] = dataclasses.replace(
                base, ok=False, message="; ".join(m for m in (base.message, v.message) if m),
                problems=base.problems + v.problems, blocked_by=base.blocked_by if not base.ok else v.blocked_by)
    return list(merged.values())


def each_iteration(spec: CaseSpec, records: tuple[Record, ...],
                   judge: Callable[[CaseSpec, tuple[Record, ...]], list[Verdict]]) -> list[Verdict]:
    """`judge(spec, records)` on iteration 1, then on each later iteration every record completed under its probes
    (records[0] is the run judged; the others what it is judged beside, e.g. eager's run), merged per check. A first
    iteration not observed (a raise) is the verdict: the later ones are not judged then."""
    verdicts = judge(spec, records)
    iterations = judged_iterations(*records) if all(v.ok or v.blocked_by is None for v in verdicts) else []
    for k in iterations:
        spec_k = spec_at(spec, k)
        found = judge(spec_k, tuple(r.at_iteration(k) for r in records))
        verdicts = _merge(verdicts, [_prefixed(v, k, spec, spec_k) for v in found])
    for v in verdicts:
        v.figures[ITERATIONS_FIGURE] = 1 + len(iterations)
    return verdicts
