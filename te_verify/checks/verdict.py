"""A check's result: pass/fail, a message naming the element, and figures for the report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    # Name of the check that produced it (e.g. "grad_parity").
    check: str
    # True when the check passed.
    ok: bool
    # Why it failed (names case, backend, parameter and figure); empty when ok.
    message: str = ""
    # Figures the check measured, merged into the report row.
    figures: dict[str, Any] = field(default_factory=dict)
    # The failure itemized, one problem per element (a parameter's gradient), where the check itemizes: a known gap
    # scoped to some elements (expectations `elements`) leaves the others judged.
    problems: tuple[str, ...] = ()
    # Set on a failure that is "not observed" because of another check's outcome: the check whose failure explains
    # it ("ending": the run ended before what this check reads). A known gap covering that check covers this one.
    blocked_by: str | None = None


def not_observed(check: str, case_id: str, backend: str, why: str, figures: dict | None = None,
                 blocked_by: str | None = "ending") -> Verdict:
    """A check that could not observe what it judges: it fails, saying so and why (never a pass from nothing)."""
    return Verdict(check, False, f"[{case_id}] backend {backend}: {check} not observed: {why}", dict(figures or {}),
                   blocked_by=blocked_by)


class CheckFailures(AssertionError):
    """A case whose checks did not all pass: carries every verdict, so known gaps are judged check by check."""

    def __init__(self, verdicts: list[Verdict]) -> None:
        super().__init__("\n".join(failed_messages(verdicts)))
        self.verdicts = list(verdicts)


def failed_messages(verdicts: list[Verdict]) -> list[str]:
    return [v.message for v in verdicts if not v.ok]


def waste_ratio(actual: float, required: float) -> float | None:
    """actual / required, the report's waste figure: 1.0 is the goal, and 0/0 counts as 1.0.
    None when something was spent where nothing was required (no finite ratio)."""
    if required == 0:
        return 1.0 if actual == 0 else None
    return round(actual / required, 4)
