"""LayerNormLinear layers and LayerNormMLP pairs in the TE stack families (spec.te.module "layernorm_linear" and
"layernorm_mlp"; issue 36 item 4).

Each layer is a layer norm, then its linear (models.normed; TE's LayerNormLinear in te_eager), the norm frozen with
the layer's bias. Mask pairs: weight and bias (and norm) frozen together, every weight trained beside frozen norms and
biases (the layer input then needs no gradient although the weight does: the oracle requires no dgrad GEMM and no
norm backward there), and BitFit-style norms and biases trained under frozen weights. High precision only: the FP8
cases' same-quantization reference (te_verify.te.reference) has no LayerNormLinear yet. Drawn over masks and
input gradient: the pr tier three cases (norm_specs), nightly the grid over every mask.
LayerNormMLP (mlp_specs) pairs the stack's layers (hidden -> ffn -> hidden): fc1 behind the norm, fc2 behind the
activation, the same mask pairs, each pr case with another activation: TE's default gelu (its high-precision
bias+GELU runs in TE's Python, jit.py) and relu and srelu (tex's activation kernels, te/tecpu/activation.py).
"""
from __future__ import annotations

from te_verify.matrix.te_masks import WEIGHT_TRAINED_BIAS_FROZEN
from te_verify.matrix.tiers import all_masks, check_tier, named_masks
from te_verify.spec import MLP_ACTIVATIONS, CaseSpec, TEConfig

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


MLP_WIDTHS = (32, 64, 32, 64, 32)  # two LayerNormMLPs: hidden 32, ffn 64
# pr: the _PR mask pairs, each with another activation (gelu the default; relu and srelu reach tex's kernels).
_PR_ACTIVATIONS = ("gelu", "srelu", "relu")


def mlp_specs(tier: str, family: str, **te) -> list[CaseSpec]:
    """`family`'s LayerNormMLP cases on MLP_WIDTHS: none in smoke, in pr _PR's mask pairs with _PR_ACTIVATIONS, in
    nightly every mask on weight, bias and norm together x input gradient with gelu, and _PR's mask pairs x input
    gradient x every activation."""
    check_tier(tier)
    if tier == "smoke":
        return []
    def case(masks, x, activation):
        (w, b) = masks
        return CaseSpec(family, MLP_WIDTHS, w, b, x, (16,), te=TEConfig(module="layernorm_mlp", activation=activation, **te))
    if tier == "pr":
        return [case(m, x, a) for (m, x), a in zip(_PR, _PR_ACTIVATIONS)]
    grid = [case((m, m), x, "gelu") for m in all_masks(4) for x in (False, True)]
    grid += [case(m, x, a) for m, _ in _PR for x in (False, True) for a in MLP_ACTIVATIONS]
    return list(dict.fromkeys(grid))
