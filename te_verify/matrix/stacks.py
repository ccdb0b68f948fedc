"""Case generators for the torch lane, by family and tier, plus hypothesis strategies for nightly.

Tiers and shared shapes: matrix.tiers.
"""
from __future__ import annotations

from typing import Callable

from hypothesis import strategies as st

from te_verify.matrix.tiers import (GENERATED, NON_SQUARE4, ODD_WIDTHS, SQUARE4, all_masks, check_tier, dedupe,
                                    named_masks)
from te_verify.spec import CaseSpec

def freeze_specs(tier: str) -> list[CaseSpec]:
    """Every freeze mask of 4 square layers, weights and biases frozen together, input with/without grad."""
    check_tier(tier)
    masks = all_masks(4) if tier != "smoke" else list(named_masks(4).values())
    x_grads = (False, True) if tier != "smoke" else (False,)
    specs = [CaseSpec("freeze", SQUARE4, m, m, x) for m in masks for x in x_grads]
    if tier == "nightly":  # every mask again on the non-square stack, 3-D, bf16, and with a second seed
        specs += [CaseSpec("freeze", NON_SQUARE4, m, m, x, (4, 6), dtype, seed=seed)
                  for m in masks for x in x_grads for dtype in ("fp32", "bf16") for seed in (0, 1)]
    return dedupe(specs)


def shapes_specs(tier: str) -> list[CaseSpec]:
    """Depths 2-6, the non-square stack, widths that are not multiples of 8/16, 2-D and 3-D inputs."""
    check_tier(tier)
    stacks = [NON_SQUARE4, *ODD_WIDTHS] + [(32,) * (n + 1) for n in (2, 3, 5, 6)]
    if tier == "smoke":
        stacks = [NON_SQUARE4, ODD_WIDTHS[0]]
    batches = ((8,), (4, 6)) if tier != "smoke" else ((4, 6),)
    specs = []
    for widths in stacks:
        n = len(widths) - 1
        for pattern in ("alternating", "prefix", "suffix") if tier != "smoke" else ("alternating",):
            mask = named_masks(n)[pattern]
            for batch in batches:
                specs.append(CaseSpec("shapes", widths, mask, mask, pattern == "suffix", batch))
    return dedupe(specs)


def bias_specs(tier: str) -> list[CaseSpec]:
    """Weight and bias frozen independently: frozen weight with trainable bias and the reverse, plus no bias."""
    check_tier(tier)
    n = 4
    alt, none, every = named_masks(n)["alternating"], (False,) * n, (True,) * n
    inverse = tuple(not b for b in alt)
    pairs = [(alt, none), (none, alt), (every, none), (alt, inverse), (none, every)]
    if tier == "smoke":
        pairs = pairs[:2]
    specs = [CaseSpec("bias", SQUARE4, w, b) for w, b in pairs]
    specs += [CaseSpec("bias", NON_SQUARE4, w, b, True) for w, b in pairs]
    specs += [CaseSpec("bias", SQUARE4, alt, None), CaseSpec("bias", NON_SQUARE4, every, None, True)]
    return dedupe(specs)


def dtype_specs(tier: str) -> list[CaseSpec]:
    """bf16 across the freeze patterns and both stacks."""
    check_tier(tier)
    patterns = ("alternating", "prefix", "suffix", "none") if tier != "smoke" else ("alternating",)
    specs = []
    for widths in (SQUARE4, NON_SQUARE4):
        for pattern in patterns:
            mask = named_masks(4)[pattern]
            specs.append(CaseSpec("dtype", widths, mask, mask, True, (4, 6), "bf16"))
    return dedupe(specs)


def replay_specs(tier: str) -> list[CaseSpec]:
    """1, 2 and 3 backward passes over one graph with retain_graph=True."""
    check_tier(tier)
    replays = (2, 3) if tier != "smoke" else (2,)
    patterns = ("alternating", "none", "prefix") if tier != "smoke" else ("alternating",)
    specs = [CaseSpec("replay", SQUARE4, named_masks(4)[p], named_masks(4)[p], p != "prefix", (8,), "fp32", r)
             for p in patterns for r in replays]
    if tier != "smoke":
        specs.append(CaseSpec("replay", NON_SQUARE4, named_masks(4)["alternating"], None, True, (4, 6), "bf16", 3))
    # Replays after a plain training step (the first backward compiled without retain_graph).
    specs += [s.replace(warmup_steps=1) for s in specs if s.replays == 2]
    return dedupe(specs)


def timing_specs(tier: str) -> list[CaseSpec]:
    """Freezing before versus after the backend prepares the model, and unfreezing after (a PEFT step)."""
    check_tier(tier)
    timings = ("before", "after", "unfreeze_after")
    patterns = ("alternating", "prefix") if tier != "smoke" else ("alternating",)
    return dedupe([CaseSpec("timing", NON_SQUARE4, named_masks(4)[p], named_masks(4)[p], False, (8,), "fp32", 1, t)
                    for p in patterns for t in timings])


def schedule_specs(tier: str) -> list[CaseSpec]:
    """Freeze schedules (CaseSpec.schedule): a frozen backbone unfrozen after the first iteration, everything but the
    head frozen after it; nightly adds a LoRA-style swap then biases alone, a later swap, the non-square stack, 3-D,
    bf16, an input needing grad and freezing after prepare. Every iteration trains something (a step with nothing
    to train raises in eager too and would end the run before the change)."""
    check_tier(tier)
    masks = named_masks(4)
    plans = [(masks["prefix"], ((2, "unfreeze_all"),)), (masks["none"], ((2, "freeze_all_but_last"),))]
    if tier == "smoke":
        plans = plans[:1]
    if tier == "nightly":
        plans += [(masks["alternating"], ((2, "swap"), (3, "bias_only"))), (masks["suffix"], ((3, "swap"),))]
    specs = [CaseSpec("schedule", SQUARE4, m, m, schedule=plan) for m, plan in plans]
    if tier == "nightly":
        specs += [CaseSpec("schedule", NON_SQUARE4, m, m, x, (4, 6), dtype, freeze_timing=timing, schedule=plan)
                  for m, plan in plans for x in (False, True) for dtype in ("fp32", "bf16")
                  for timing in ("before", "after")]
    return dedupe(specs)


def accumulation_specs(tier: str) -> list[CaseSpec]:
    """Gradient accumulation (CaseSpec.microbatches): every forward first over 2 microbatches on the alternating mask
    with the input needing a gradient (pr); nightly both orders over 2 and 3 microbatches, more masks, split weight
    and bias masks, no bias, 3-D, bf16 and freezing after prepare."""
    check_tier(tier)
    masks = named_masks(4)
    alt = masks["alternating"]
    pr = [CaseSpec("accumulation", SQUARE4, alt, alt, True, microbatches=2, accumulation="forwards_first")]
    if tier != "nightly":
        return pr if tier == "pr" else []
    orders = [(n, order) for n in (2, 3) for order in ("interleaved", "forwards_first")]
    specs = [CaseSpec("accumulation", SQUARE4, masks[p], masks[p], x, microbatches=n, accumulation=order)
             for p in ("alternating", "prefix", "none") for x in (False, True) for n, order in orders]
    specs += [CaseSpec("accumulation", NON_SQUARE4, alt, bias, True, (4, 6), dtype, freeze_timing=timing,
                       microbatches=2, accumulation=order)
              for bias in (tuple(not b for b in alt), None) for dtype in ("fp32", "bf16")
              for timing in ("before", "after") for order in ("interleaved", "forwards_first")]
    return dedupe(pr + specs)


FAMILIES: dict[str, Callable[[str], list[CaseSpec]]] = {
    "freeze": freeze_specs,
    "shapes": shapes_specs,
    "bias": bias_specs,
    "dtype": dtype_specs,
    "replay": replay_specs,
    "timing": timing_specs,
    "schedule": schedule_specs,
    "accumulation": accumulation_specs,
}


@st.composite
def case_specs(draw, family: str = GENERATED, max_layers: int = 6) -> CaseSpec:
    """Any valid torch-lane spec; shrinks towards one small fp32 layer with nothing frozen."""
    # Fixed-length draws sliced to the depth: shrinking the depth then only truncates, so the shrinker can
    # always reach the shallowest failing stack (length-dependent draws shift the data and stall it).
    n = draw(st.integers(1, max_layers), label="layers")
    widths = tuple(draw(st.lists(st.integers(1, 48), min_size=max_layers + 1, max_size=max_layers + 1),
                        label="widths")[:n + 1])
    weight_frozen = tuple(draw(st.lists(st.booleans(), min_size=max_layers, max_size=max_layers),
                               label="weight_frozen")[:n])
    bias = draw(st.booleans(), label="bias")
    bias_mask = draw(st.lists(st.booleans(), min_size=max_layers, max_size=max_layers), label="bias_frozen")[:n]
    bias_frozen = tuple(bias_mask) if bias else None
    batch_shape = draw(st.one_of(st.tuples(st.integers(1, 8)), st.tuples(st.integers(1, 4), st.integers(1, 6))),
                       label="batch_shape")
    return CaseSpec(
        family=family,
        widths=widths,
        weight_frozen=weight_frozen,
        bias_frozen=bias_frozen,
        input_requires_grad=draw(st.booleans(), label="input_requires_grad"),
        batch_shape=batch_shape,
        dtype=draw(st.sampled_from(("fp32", "bf16")), label="dtype"),
        replays=draw(st.integers(1, 3), label="replays"),
        warmup_steps=draw(st.integers(0, 1), label="warmup_steps"),
        freeze_timing=draw(st.sampled_from(("before", "after", "unfreeze_after")), label="freeze_timing"),
        seed=draw(st.integers(0, 3), label="seed"),
    )
