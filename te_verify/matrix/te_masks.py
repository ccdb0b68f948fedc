"""Weight and bias masks drawn independently in the TE stack families (issue 34, item 4).

The TE families otherwise freeze a layer's weight and bias together, or every weight with every bias trained
(BitFit, `te.bitfit`). These are the other combinations: every weight trained with every bias frozen, and per-layer
mixes in which the four (weight, bias) combinations stand side by side in one stack. They meet the family's other
factors (recipe, delayed wgrad, main_grad, microbatches, module kind, input gradient) pairwise: the nightly tier
holds the whole grid, the pr tier its pairwise cover, over one of the two mixes per family (`mix`).
"""
from __future__ import annotations

from te_verify.matrix.selection import tier_grid
from te_verify.matrix.tiers import check_tier, named_masks
from te_verify.spec import CaseSpec, TEConfig

_NAMED = named_masks(4)
Masks = tuple[tuple[bool, ...], tuple[bool, ...]]  # (weight_frozen, bias_frozen)
# Every weight trained, every bias frozen: TE's wgrad path then carries a bias gradient nobody asked for.
WEIGHT_TRAINED_BIAS_FROZEN: Masks = (_NAMED["none"], _NAMED["all"])
# Per-layer mixes: each holds all four combinations, one per layer, in two orders (frozen/frozen, trained weight +
# frozen bias, frozen weight + trained bias, trained/trained; and frozen/frozen, frozen + trained, trained + frozen,
# trained/trained), so a layer's treatment cannot leak into its neighbour's unseen.
MIXES: tuple[Masks, Masks] = ((_NAMED["alternating"], _NAMED["prefix"]), (_NAMED["prefix"], _NAMED["alternating"]))
# One MoE layer holds one (weight, bias) pair: trained weight, frozen bias; its mix is two layers, one of each.
MOE_ONE: Masks = ((False,), (True,))
MOE_MIX: Masks = ((False, True), (True, False))


def split_mask_specs(tier: str, family: str, widths: tuple[int, ...], options: list[dict], mix: int = 0,
                     x_grads: tuple[bool, ...] = (False, True), masks: tuple[Masks, ...] = (), **spec) -> list[CaseSpec]:
    """`masks` (default: the trained-weight/frozen-bias pattern and mix number `mix` in pr, both mixes in nightly) x TE
    `options` (TEConfig keywords) x `x_grads` on `widths`, by tier (selection.tier_grid). `spec`: further CaseSpec
    fields (batch_shape defaults to (16,), the FP8 GEMMs' rows)."""
    check_tier(tier)
    masks = masks or ((WEIGHT_TRAINED_BIAS_FROZEN, *MIXES) if tier == "nightly" else
                      (WEIGHT_TRAINED_BIAS_FROZEN, MIXES[mix]))
    spec.setdefault("batch_shape", (16,))
    return tier_grid(tier, [CaseSpec(family, widths, w, b, x, te=TEConfig(**o), **spec)
                            for w, b in masks for o in options for x in x_grads])
