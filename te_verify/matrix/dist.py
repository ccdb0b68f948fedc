"""Case generators for the distributed lane, one family per wrapper, by tier.

Shapes and freeze patterns come from the single-process lane (te_verify.matrix.tiers). Filtered out, with reasons:
all-frozen models (DDP refuses to wrap a model with no trainable parameter; nothing to communicate for the
others), replays > 1 (one backward per case: DDP and FSDP reject a second backward over one graph by
design), and for fairscale with flatten_parameters a layer whose weight and bias differ in requires_grad
(fairscale asserts uniform requires_grad per flattened unit), and bf16 (a sharded bf16 reduction rounds
per shard, so it cannot meet the single-process bf16 tolerance against one global matmul; needs its own
reference, not looser numbers).
"""
from __future__ import annotations

import dataclasses

from te_verify.matrix.tiers import NON_SQUARE4, ODD_WIDTHS, SQUARE4, check_tier, dedupe, named_masks
from te_verify.spec import PROJECTIONS, CaseSpec, DistConfig, ModelConfig

WORLD_SIZE = 2
MIDDLE = (False, True, False, False)  # a frozen middle layer: the reshard-timing case of seed 004


def _masks(tier: str) -> dict[str, tuple[bool, ...]]:
    masks = {k: v for k, v in named_masks(4).items() if k != "all"}
    masks["middle"] = MIDDLE
    return masks if tier != "smoke" else {"middle": MIDDLE}


def _spec(family: str, wrapper: str, mask, x_grad: bool = False, options: tuple = (), widths=SQUARE4,
          bias=None, batch=(8,), dtype="fp32", timing="before") -> CaseSpec:
    bias_mask = mask if bias is None else bias
    return CaseSpec(family, widths, mask, bias_mask, x_grad, batch, dtype, 1, timing,
                    dist=DistConfig(wrapper, WORLD_SIZE, tuple(sorted(options))))


def _pattern_grid(family: str, wrapper: str, tier: str, options: tuple = ()) -> list[CaseSpec]:
    x_grads = (False, True) if tier != "smoke" else (False,)
    return [_spec(family, wrapper, m, x, options) for m in _masks(tier).values() for x in x_grads]


def _timing(family: str, wrapper: str, options: tuple = ()) -> list[CaseSpec]:
    """Freeze after wrapping, and unfreeze after wrapping (a PEFT schedule step)."""
    alt = named_masks(4)["alternating"]
    return [_spec(family, wrapper, alt, False, options, NON_SQUARE4, timing=t) for t in ("after", "unfreeze_after")]


def schedule_specs(tier: str) -> list[CaseSpec]:
    """Freeze schedules after wrapping (CaseSpec.schedule): a frozen prefix unfrozen after the first iteration, all
    but the head frozen after it, on DDP and FSDP2; nightly adds DDP with find_unused_parameters, FSDP1 and a swap.
    No training engine: their TrainSteps build the optimizer over what trains at wrap and cannot follow a change yet
    (docs/freeze-schedules.md)."""
    check_tier(tier)
    masks = named_masks(4)
    plans = [(masks["prefix"], ((2, "unfreeze_all"),)), (masks["none"], ((2, "freeze_all_but_last"),))]
    wrappers = [("ddp", ()), ("fsdp2", ())]
    if tier == "smoke":
        plans = plans[:1]
    if tier == "nightly":
        plans.append((masks["alternating"], ((2, "swap"),)))
        wrappers += [("ddp", (("find_unused_parameters", True),)), ("fsdp", ())]
    return dedupe([_spec("dist_schedule", w, m, options=opts).replace(schedule=plan)
                   for w, opts in wrappers for m, plan in plans])


# The wrappers whose gradient accumulation the lane drives (spec.ACCUMULATING_WRAPPERS), each with its options.
ACCUMULATING = [("ddp", ()), ("fsdp", (("sharding", "FULL_SHARD"),)), ("fsdp2", (("reshard_after_forward", True),)),
                ("fairscale_fsdp", (("flatten_parameters", True), ("reshard_after_forward", True)))]


def accumulation_specs(tier: str) -> list[CaseSpec]:
    """Gradient accumulation (CaseSpec.microbatches) under each wrapper's no-sync context: every forward first over 2
    microbatches of each rank's shard, the frozen middle layer, the input needing a gradient (pr); nightly both
    orders over 2 and 4 microbatches, the alternating mask, and DDP with find_unused_parameters, FSDP's SHARD_GRAD_OP
    and FSDP2 without resharding after forward."""
    check_tier(tier)
    first = [_spec("dist_accumulation", w, MIDDLE, True, opts).replace(microbatches=2, accumulation="forwards_first")
             for w, opts in ACCUMULATING]
    if tier != "nightly":
        return first if tier == "pr" else []
    wrappers = ACCUMULATING + [("ddp", (("find_unused_parameters", True),)), ("fsdp", (("sharding", "SHARD_GRAD_OP"),)),
                               ("fsdp2", (("reshard_after_forward", False),))]
    specs = [_spec("dist_accumulation", w, m, True, opts).replace(microbatches=n, accumulation=order)
             for w, opts in wrappers for m in (MIDDLE, named_masks(4)["alternating"]) for n in (2, 4)
             for order in ("interleaved", "forwards_first")]
    return dedupe(first + specs)


# A wrapper's mixed-precision policy as users configure it: bf16 compute over fp32 parameters, fp32 reduction.
POLICY = ("bf16", "fp32")
POLICY_WRAPPERS = (("fsdp2", (("reshard_after_forward", True),)), ("fsdp", (("sharding", "FULL_SHARD"),)),
                   ("fsdp2", (("reshard_after_forward", False),)), ("fsdp", (("sharding", "SHARD_GRAD_OP"),)))


def mixed_precision_specs(tier: str) -> list[CaseSpec]:
    """FSDP2 MixedPrecisionPolicy and FSDP1 MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) over fp32 parameters
    (DistConfig.param_dtype / reduce_dtype): smoke one each of FSDP2 and FSDP1 (frozen middle layer, input grad); pr
    adds FSDP2 without reshard after forward, FSDP1 SHARD_GRAD_OP, and on both a frozen prefix unfrozen after the
    first iteration (a freeze schedule); nightly every mask with and without input grad, odd widths, freezing after
    wrapping and a schedule freezing all but the head. NO_SHARD is left out: it all-reduces without gathering, and the lane counts
    every FSDP1 case as sharding (verify.shards), so its gather dtype would read as not observed."""
    check_tier(tier)
    wrappers = POLICY_WRAPPERS[:2] if tier == "smoke" else POLICY_WRAPPERS
    specs = [_spec("dist_mixed_precision", w, MIDDLE, True, opts) for w, opts in wrappers]
    if tier != "smoke":  # a frozen prefix's first forward, then unfrozen: pytorch/pytorch#186998's order
        plans = [(named_masks(4)["prefix"], ((2, "unfreeze_all"),))]
        plans += [(named_masks(4)["none"], ((2, "freeze_all_but_last"),))] if tier == "nightly" else []
        specs += [_spec("dist_mixed_precision", w, m).replace(schedule=plan) for w in ("fsdp2", "fsdp")
                  for m, plan in plans]
    if tier == "nightly":
        specs += [_spec("dist_mixed_precision", w, m, x, opts) for w, opts in wrappers
                  for m in _masks(tier).values() for x in (False, True)]
        specs += [_spec("dist_mixed_precision", w, named_masks(3)["alternating"], True, opts, ODD_WIDTHS[1],
                        batch=(4, 6)) for w, opts in wrappers[:2]]
        specs += _timing("dist_mixed_precision", "fsdp2") + _timing("dist_mixed_precision", "fsdp")
    return dedupe([s.replace(dist=dataclasses.replace(s.dist, param_dtype=POLICY[0], reduce_dtype=POLICY[1]))
                   for s in specs])


def ddp_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    specs = _pattern_grid("dist_ddp", "ddp", tier)
    if tier == "smoke":
        return specs
    alt = named_masks(4)["alternating"]
    for opt in (("find_unused_parameters", True), ("static_graph", True), ("gradient_as_bucket_view", True),
                ("bucket_cap_mb", 0.001)):
        specs.append(_spec("dist_ddp", "ddp", alt, True, (opt,)))
    specs.append(_spec("dist_ddp", "ddp", alt, True, widths=NON_SQUARE4, bias=tuple(not b for b in alt), batch=(4, 6)))
    specs += _timing("dist_ddp", "ddp", (("find_unused_parameters", True),))
    return dedupe(specs)


def fsdp_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    specs = []
    for sharding in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD") if tier != "smoke" else ("FULL_SHARD",):
        opts = (("sharding", sharding),)
        masks = _masks(tier) if sharding != "NO_SHARD" else {"middle": MIDDLE, "prefix": named_masks(4)["prefix"]}
        specs += [_spec("dist_fsdp", "fsdp", m, x, opts) for m in masks.values() for x in (False, True)]
    if tier != "smoke":
        specs += _timing("dist_fsdp", "fsdp")
    return dedupe(specs)


def fsdp2_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    specs = []
    for reshard in (True, False) if tier != "smoke" else (True,):
        specs += _pattern_grid("dist_fsdp2", "fsdp2", tier, (("reshard_after_forward", reshard),))
    if tier != "smoke":
        alt = named_masks(3)["alternating"]
        specs.append(_spec("dist_fsdp2", "fsdp2", alt, True, widths=ODD_WIDTHS[1], batch=(4, 6)))
        specs += _timing("dist_fsdp2", "fsdp2")
    return dedupe(specs)


def fairscale_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    specs = []
    grid = [(r, f) for r in (True, False) for f in (True, False)] if tier != "smoke" else [(True, True)]
    masks = [MIDDLE, named_masks(4)["alternating"]] if tier != "smoke" else [MIDDLE]
    for reshard, flatten in grid:
        opts = (("flatten_parameters", flatten), ("reshard_after_forward", reshard))
        specs += [_spec("dist_fairscale", "fairscale_fsdp", m, True, opts) for m in masks]
    return dedupe(specs)


def thunder_ddp_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    masks = [MIDDLE, named_masks(4)["none"]] if tier != "smoke" else [MIDDLE]
    return dedupe([_spec("dist_thunder", "thunder_ddp", m, True) for m in masks])


def thunder_fsdp_specs(tier: str) -> list[CaseSpec]:
    check_tier(tier)
    masks = [MIDDLE, named_masks(4)["none"]] if tier != "smoke" else [MIDDLE]
    return dedupe([_spec("dist_thunder", "thunder_fsdp", m, True) for m in masks])


LORA_QV = ("q", "v")


def _lora_spec(wrapper: str, lora_on: tuple[str, ...], batch: tuple[int, int] = (2, 8), x_grad: bool = False,
               options: tuple = (), timing: str = "before", blocks: int = 1, kind: str = "llama") -> CaseSpec:
    tokens = kind == "litgpt_lora"  # LitGPT's GPT takes token ids and ends in its head
    model = ModelConfig(kind, blocks=blocks, n_embd=32, n_head=4, intermediate=64, lora_on=lora_on, embedding=tokens,
                        head=tokens)
    return CaseSpec("dist_lora", (model.in_width, model.out_width), (), None, x_grad, batch, "fp32", 1, timing,
                    dist=DistConfig(wrapper, WORLD_SIZE, tuple(sorted(options))), model=model)


def dist_lora_specs(tier: str) -> list[CaseSpec]:
    """LoRA Llama blocks (frozen base linears, trainable adapters and norms) under the wrappers, FSDP2 first; the
    library-model families (transformers + peft, LitGPT) under DDP and FSDP2.

    One FSDP unit per block. Freezing after wrapping (by the parameters' pre-wrap names) runs on ddp (with
    find_unused_parameters: DDP's buckets are fixed at construction) and fsdp2. "unfreeze_after" is left out: the
    eager reference's runner.prepare_frozen calls unfreeze_all(model), which iterates a stack's layers and raises
    on a family's model ("'Llama' object is not iterable"). fairscale is left out: with
    flatten_parameters every unit needs uniform requires_grad (a LoRA block mixes them) and the fairscale wrapper
    here keeps a stack's per-layer bookkeeping."""
    check_tier(tier)
    if tier == "smoke":
        return [_lora_spec("fsdp2", LORA_QV, options=(("reshard_after_forward", True),)),
                _lora_spec("ddp", LORA_QV)]
    specs = []
    for lora in (LORA_QV, PROJECTIONS):
        for reshard in (True, False):
            specs.append(_lora_spec("fsdp2", lora, options=(("reshard_after_forward", reshard),)))
        specs.append(_lora_spec("fsdp2", lora, (4, 8), x_grad=True))
        specs.append(_lora_spec("ddp", lora))
        specs.append(_lora_spec("fsdp", lora, options=(("sharding", "FULL_SHARD"),)))
    specs.append(_lora_spec("ddp", LORA_QV, (4, 8), x_grad=True))
    specs.append(_lora_spec("fsdp", LORA_QV, options=(("sharding", "SHARD_GRAD_OP"),)))
    specs.append(_lora_spec("fsdp2", LORA_QV, timing="after"))
    specs.append(_lora_spec("ddp", LORA_QV, timing="after", options=(("find_unused_parameters", True),)))
    specs.append(_lora_spec("thunder_ddp", LORA_QV))
    specs.append(_lora_spec("thunder_fsdp", LORA_QV))
    # The library-model families (issue 19) under DDP; FSDP2 (one unit per decoder layer) in nightly.
    specs += [_lora_spec("ddp", LORA_QV, kind="hf_peft"), _lora_spec("ddp", LORA_QV, kind="litgpt_lora")]
    if tier == "nightly":
        for kind in ("hf_peft", "litgpt_lora"):
            specs.append(_lora_spec("ddp", PROJECTIONS, kind=kind, blocks=2))
            specs.append(_lora_spec("fsdp2", LORA_QV, kind=kind, options=(("reshard_after_forward", True),)))
        specs.append(_lora_spec("ddp", LORA_QV, (4, 8), x_grad=True, kind="hf_peft"))
        for wrapper in ("ddp", "fsdp", "fsdp2", "thunder_ddp", "thunder_fsdp"):
            specs.append(_lora_spec(wrapper, PROJECTIONS, (4, 8), x_grad=True, blocks=2))
        specs.append(_lora_spec("thunder_ddp", PROJECTIONS))
        specs.append(_lora_spec("fsdp", LORA_QV, options=(("sharding", "NO_SHARD"),)))
        specs.append(_lora_spec("thunder_fsdp", PROJECTIONS, (4, 8), x_grad=True))
    return dedupe(specs)


FAMILIES = {
    "dist_ddp": ddp_specs,
    "dist_fsdp": fsdp_specs,
    "dist_fsdp2": fsdp2_specs,
    "dist_fairscale": fairscale_specs,
    "dist_thunder_ddp": thunder_ddp_specs,
    "dist_thunder_fsdp": thunder_fsdp_specs,
    "dist_lora": dist_lora_specs,
    "dist_accumulation": accumulation_specs,
}


def all_specs(tier: str) -> list[CaseSpec]:
    return [spec for family in FAMILIES.values() for spec in family(tier)]
