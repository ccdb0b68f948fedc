"""Tiers and the shapes every lane's generators share: which tier a run asks for, the stacks' widths, the freeze
masks, and dedupe (every generated list free of duplicate ids, in a fixed order on every xdist worker).

Tiers: "smoke" (seconds), "pr" (minutes on 2 cores; chosen pairwise, matrix.selection), "nightly" (exhaustive, plus
hypothesis).
"""
from __future__ import annotations

import itertools

from te_verify.spec import CaseSpec

TIERS = ("smoke", "pr", "nightly")
# The families whose specs hypothesis draws (nightly, seeded by the UTC date): which of their entries a run meets
# depends on the day's draw.
GENERATED, GENERATED_MODEL = "generated", "generated_model"
DRAWN_FAMILIES = (GENERATED, GENERATED_MODEL)
SQUARE4 = (32, 32, 32, 32, 32)
NON_SQUARE4 = (32, 64, 128, 64, 32)  # the reviewer's stack in seed 000
ODD_WIDTHS = ((13, 37, 23), (5, 7, 3, 11), (24, 40, 17, 9, 33))  # not multiples of 8 or 16

# bf16 where users train in it (issue 34): high-precision cases sized so that grad_scale resolves a 1% lean of every
# gradient they train (docs/tolerances.md, "What a bf16 case must hold"). A trained bias's gradient is a sum over rows
# whose terms cancel, so rows do not average its rounding noise and only its width does: 256 wide over 32 rows (at the
# non-square stack's 16 rows a bias's allowance is 2-3%). A GroupedLinear's experts 128 wide over 64 rows each. FP8 in
# bf16 cannot resolve 1% (its quantized truth's floor is 16 bf16 roundings, 3%), so bf16 draws are high precision.
BF16_STACK = (256,) * 5
BF16_ROWS = (32,)
BF16_MOE_WIDTHS = (128, 128)
BF16_MOE_ROWS = (256,)


class TierError(ValueError):
    """An unknown tier name."""


def check_tier(tier: str) -> None:
    if tier not in TIERS:
        raise TierError(f"--tier {tier!r}: expected one of {', '.join(TIERS)}")


def all_masks(n: int) -> list[tuple[bool, ...]]:
    """Every freeze mask of n layers, all-trainable first, all-frozen last."""
    return [tuple(bool(b) for b in bits) for bits in itertools.product((0, 1), repeat=n)]


def named_masks(n: int) -> dict[str, tuple[bool, ...]]:
    """The PEFT-style patterns: alternating (even layers frozen, seed 000), prefix- and suffix-frozen."""
    half = n // 2
    return {
        "alternating": tuple(i % 2 == 0 for i in range(n)),
        "prefix": tuple(i < half for i in range(n)),
        "suffix": tuple(i >= n - half for i in range(n)),
        "none": (False,) * n,
        "all": (True,) * n,
    }


def dedupe(specs: list[CaseSpec]) -> list[CaseSpec]:
    seen: dict[str, CaseSpec] = {}
    for spec in specs:
        seen.setdefault(spec.id, spec)
    return list(seen.values())


