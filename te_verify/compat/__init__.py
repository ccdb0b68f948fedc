"""Compatibility steps applied to released packages that cannot run here as shipped.

Each step is version-guarded, confined to what it must touch, and recorded in APPLIED so the report
header can say it was applied.
"""
from __future__ import annotations

APPLIED: list[str] = []


def record(step: str) -> None:
    if step not in APPLIED:
        APPLIED.append(step)
