"""Activation recompute in the TE lane (CaseSpec.recompute on a stack of te.Linear): each pair of TE modules under
torch's checkpoint (both modes) in high precision, and under TE's own `distributed.checkpoint` (TE's default,
reentrant) in high precision and under the FP8 recipes. The pr tier gets a handful (its only candidates with a
recompute value, so the pairwise choice takes them); nightly the freeze patterns x input-gradient need.

Left out, with the reason:
- torch's checkpoint under an FP8 recipe: it recomputes outside TE's autocast, so the recomputed forward runs in high
  precision (measured, TE 2.20.2 over the emulation, delayed scaling: reentrant gradients differ from the
  uncheckpointed run's by 6e-3, non-reentrant raises torch's CheckpointError "A different number of tensors was saved
  during the original forward and recomputation"); TE's checkpoint, which re-enters TE's autocast with the forward's
  recipe and scales, is what TE documents for FP8.
- TE's non-reentrant checkpoint ("te_nonreentrant"; valid, planted twin in tests/test_te_recompute_planted.py): its
  pack hook keeps every save of its region in TE's own frame, out of the saved-tensor probe's sight, so te_saved_bytes
  says "not observed" on every such case (checks.te_waste.TE_FRAME) until the probe reads TE's frame.
- a reentrant checkpoint (torch's, or TE's default) around a block that trains while its input needs no gradient
  (matrix.recompute.reentrant_drops_grads): it runs under no_grad and its parameters get no gradient.
"""
from __future__ import annotations

from te_verify.matrix.recompute import reentrant_drops_grads
from te_verify.matrix.tiers import check_tier, dedupe, named_masks
from te_verify.spec import CaseSpec, TEConfig

NON_SQUARE4 = (32, 64, 128, 64, 32)
TORCH_MODES = ("nonreentrant", "reentrant")
# family -> the recipes its recompute cases run under TE's checkpoint (None: high precision).
RECIPES = {"te_peft": (None, "delayed"), "te_fp8": ("delayed", "current")}
# family -> the pr candidates, (mode, recipe, freeze pattern, input needs grad).
PR = {"te_peft": (("nonreentrant", None, "alternating", False), ("reentrant", None, "alternating", True),
                  ("te", "delayed", "alternating", True), ("te", None, "prefix", True)),
      "te_fp8": (("te", "current", "alternating", True), ("te", "delayed", "prefix", True))}


def _spec(family: str, mode: str, recipe: str | None, pattern: str, x_grad: bool) -> CaseSpec:
    mask = named_masks(4)[pattern]
    return CaseSpec(family, NON_SQUARE4, mask, mask, x_grad, (16,), te=TEConfig(recipe=recipe), recompute=mode)


def te_recompute_specs(family: str, tier: str) -> list[CaseSpec]:
    """`family`'s recompute cases (te_peft, te_fp8) for `tier`; none in smoke."""
    check_tier(tier)
    if tier == "smoke":
        return []
    if tier == "pr":
        specs = [_spec(family, *candidate) for candidate in PR[family]]
    else:
        modes = [(m, None) for m in TORCH_MODES if None in RECIPES[family]]
        modes += [("te", r) for r in RECIPES[family]]
        specs = [_spec(family, m, r, p, x) for m, r in modes for p in ("alternating", "prefix", "suffix", "none")
                 for x in (False, True)]
        specs += [_spec(family, *candidate) for candidate in PR[family]]
    return dedupe([s for s in specs if not reentrant_drops_grads(s)])
