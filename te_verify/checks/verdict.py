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


def failed_messages(verdicts: list[Verdict]) -> list[str]:
    return [v.message for v in verdicts if not v.ok]
