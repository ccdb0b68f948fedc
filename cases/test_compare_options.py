"""Same spec, two option sets of one backend: saved bytes, saved count and peak must not rise past --max-rise."""
from __future__ import annotations

import pytest

from te_verify.matrix.tiers import NON_SQUARE4, SQUARE4, check_tier, named_masks
from te_verify.run.compare_options import OPTION_SETS, compare_options
from te_verify.spec import CaseSpec

FAMILY = "compare"
LANE = "torch"


def SPECS(tier: str) -> list[CaseSpec]:
    """The PEFT patterns on the square and non-square stacks (smoke: alternating on the square one)."""
    check_tier(tier)
    patterns = ("alternating", "prefix", "none") if tier != "smoke" else ("alternating",)
    stacks = (SQUARE4, NON_SQUARE4) if tier != "smoke" else (SQUARE4,)
    return [CaseSpec(FAMILY, w, named_masks(4)[p], named_masks(4)[p], True) for w in stacks for p in patterns]


def test_compare_options(case, request):
    if case.backend_name not in OPTION_SETS:
        pytest.skip(f"{case.backend_name}: no option sets to compare (known: {', '.join(OPTION_SETS)})")
    case.require([compare_options(case.spec, case.backend_name, request.config.getoption("max_rise"))])
