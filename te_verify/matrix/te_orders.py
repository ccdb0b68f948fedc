"""Accumulation orders in the TE microbatch families (issue 34, item 5).

Gradient accumulation otherwise runs each microbatch's backward right after its forward. These cases run every
forward first, then the backwards in the same order (te.accumulation "forwards_first"): several forwards' graphs
alive at once, one module called more than once per step, the order in which a fairscale release removed FSDP's
post-backward hooks too early (fairscale PR 1079). A module that keeps per-call state on itself (its last input, a
queued wgrad, the FP8 weight copy of is_first_microbatch) must still give each backward its own forward's.
"""
from __future__ import annotations

from te_verify.matrix.selection import tier_grid
from te_verify.matrix.tiers import check_tier, named_masks
from te_verify.spec import CaseSpec, TEConfig


def order_specs(tier: str, family: str, widths: tuple[int, ...], options: list[dict],
                patterns: tuple[str, ...] = ("none",), **spec) -> list[CaseSpec]:
    """Forwards-first microbatches: freeze `patterns` (named masks, biases alike) x TE `options` (TEConfig keywords,
    microbatches among them), the input needing a gradient, by tier (selection.tier_grid)."""
    check_tier(tier)
    masks = named_masks(len(widths) - 1)
    return tier_grid(tier, [CaseSpec(family, widths, masks[p], masks[p], True, (16,),
                                     te=TEConfig(accumulation="forwards_first", **o), **spec)
                            for p in patterns for o in options])
