"""Planted backends for judging known gaps check by check: one fault recorded as a gap, and the same fault with a
second one beside it (tests/test_known_gaps.py). Usable as external backends (`--backend planted_gaps:...`)."""
from __future__ import annotations

from planted_backends import GradForFrozen, OffByOnePercent


class KeepsFrozenGrad(GradForFrozen):
    """The recorded gap: a gradient left on the first frozen weight (`grad_presence` fails)."""

    name = "keepsfrozengrad"


class KeepsFrozenGradAndOffByOnePercent(GradForFrozen):
    """The recorded gap, and layer 1's weight gradient 1% off beside it (`grad_parity` must fail the case)."""

    name = "keepsfrozengradandoffbyonepercent"

    def prepare(self, model, spec):
        OffByOnePercent().prepare(model, spec)
        return super().prepare(model, spec)
