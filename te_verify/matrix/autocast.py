"""Case generators for mixed precision on the torch lane (CaseSpec.autocast): fp32 parameters under
torch.autocast(bf16), by tier.

pr: five stacks (freeze patterns alternating, prefix, none and suffix; with and without input grad; a replay; 3-D
and 2-D inputs; matrix.selection keeps every pair they cover) and one Llama block with LoRA on q and v (frozen bases: their bf16 copies are kept only for dgrad). nightly: every
freeze mask of the square and non-square stacks with and without input grad, replays and warm-up, freezing after
the backend prepared the model, and Llama blocks with adapters everywhere or a frozen block.
"""
from __future__ import annotations

from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.matrix.tiers import NON_SQUARE4, SQUARE4, all_masks, check_tier, dedupe, named_masks
from te_verify.spec import CaseSpec, ModelConfig, TEConfig

FAMILY = "autocast"
BATCH3D = (4, 6)


def _stack(widths: tuple[int, ...], mask: tuple[bool, ...], x_grad: bool, batch: tuple[int, ...] = BATCH3D,
           **changes) -> CaseSpec:
    return CaseSpec(FAMILY, widths, mask, mask, x_grad, batch, autocast="bf16").replace(**changes)


def autocast_specs(tier: str) -> list[CaseSpec]:
    """Stacks and Llama blocks under torch.autocast(bf16) over fp32 parameters."""
    check_tier(tier)
    masks = named_masks(4)
    if tier == "smoke":
        return [_stack(NON_SQUARE4, masks["alternating"], False)]
    specs = [_stack(NON_SQUARE4, masks[p], x) for p, x in (("alternating", False), ("prefix", True), ("none", False))]
    specs += [_stack(NON_SQUARE4, masks["alternating"], True, replays=2), _stack(SQUARE4, masks["suffix"], False, (8,))]
    specs.append(model_spec(FAMILY, ModelConfig(lora_on=LORA_TARGETS["qv"]), True, autocast="bf16"))
    if tier == "nightly":
        specs += [_stack(w, m, x, b) for w, b in ((NON_SQUARE4, BATCH3D), (SQUARE4, (8,)))
                  for m in all_masks(4) for x in (False, True)]
        specs += [_stack(NON_SQUARE4, masks[p], x, replays=r, warmup_steps=1)
                  for p in ("alternating", "suffix") for x in (False, True) for r in (2, 3)]
        specs += [_stack(NON_SQUARE4, masks[p], False, freeze_timing=t)
                  for p in ("alternating", "prefix") for t in ("after", "unfreeze_after")]
        specs += [model_spec(FAMILY, cfg, x, autocast="bf16") for cfg, x in (
            (ModelConfig(lora_on=LORA_TARGETS["all"]), False), (ModelConfig(blocks=2, frozen_blocks=1), False),
            (ModelConfig(lora_on=LORA_TARGETS["qv"], embedding=True, head=True, frozen=("embedding", "head")), False))]
    return dedupe(specs)


TE_FAMILY = "te_autocast"
# FP8 recipes under the same autocast (TE quantizes the fp32 operands; its GEMMs emit bf16). The recipe is a pairwise
# factor, so a pr spec of it is a case on each TE backend: pr holds one (delayed scaling, the alternating mask without
# input grad: te_eager and thunder_te; torch_compile_te skips autocast cases), nightly both tensor-scaled recipes over
# the named masks.
TE_FP8_RECIPES = ("delayed", "current")


def _te(mask: tuple[bool, ...], x_grad: bool, recipe: str | None = None) -> CaseSpec:
    return CaseSpec(TE_FAMILY, NON_SQUARE4, mask, mask, x_grad, (16,), te=TEConfig(recipe=recipe), autocast="bf16")


def te_autocast_specs(tier: str) -> list[CaseSpec]:
    """TE Linears under torch.autocast(bf16) over fp32 parameters, without an FP8 recipe (TE casts the weights and
    inputs itself) and with delayed or current scaling (judged against te_verify.te.reference on the same FP8
    operands, which follows TE's scale and GEMM definitions: docs/mixed-precision.md)."""
    check_tier(tier)
    masks = named_masks(4)
    if tier == "smoke":
        return [_te(masks["alternating"], False)]
    specs = [_te(masks["alternating"], False), _te(masks["prefix"], True), _te(masks["alternating"], False, "delayed")]
    if tier == "nightly":
        specs += [_te(m, x, r) for r in (None, *TE_FP8_RECIPES) for m in masks.values() for x in (False, True)]
    return dedupe(specs)
