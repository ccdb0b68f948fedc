"""LayerNormLinear layers in the TE stack families (spec.te.module "layernorm_linear"; issue 36 item 4).

Each layer is a layer norm, then its linear (models.normed; TE's LayerNormLinear in te_eager), the norm frozen with
the layer's bias. Mask pairs: weight and bias (and norm) frozen together, every weight trained beside frozen norms and
biases (the layer input then needs no gradient although the weight does: the oracle requires no dgrad GEMM and no
norm backward there), and BitFit-style norms and biases trained under frozen weights. High precision only: the FP8
cases' same-quantization reference (te_verify.te.reference) has no LayerNormLinear yet. Drawn over masks and
input gradient: the pr tier three cases (norm_specs), nightly the grid over every mask.
"""
from __future__ import annotations

from te_verify.matrix.te_masks import WEIGHT_TRAINED_BIAS_FROZEN
from te_verify.matrix.tiers import all_masks, check_tier, named_masks
from te_verify.spec import CaseSpec, TEConfig

_NAMED = named_masks(4)
BITFIT = (_NAMED["all"], _NAMED["none"])  # weights frozen; norms and biases trained
# pr (the tier's time budget): one case per mask pair, the input gradient drawn so that both values appear.
_PR = (((_NAMED["alternating"],) * 2, True), (WEIGHT_TRAINED_BIAS_FROZEN, False), (BITFIT, False))


def norm_specs(tier: str, family: str, widths: tuple[int, ...], **te) -> list[CaseSpec]:
    """`family`'s LayerNormLinear cases on `widths` (`te`: further TEConfig keywords of the family): none in smoke,
    _PR in pr, in nightly every mask pair (those of _PR and every mask on weight and bias together) x input gradient."""
    check_tier(tier)
    config = TEConfig(module="layernorm_linear", **te)
    if tier != "nightly":
        return [] if tier == "smoke" else [CaseSpec(family, widths, w, b, x, (16,), te=config) for (w, b), x in _PR]
    masks = dict.fromkeys([m for m, _ in _PR] + [(m, m) for m in all_masks(4)])
    return [CaseSpec(family, widths, w, b, x, (16,), te=config) for w, b in masks for x in (False, True)]
