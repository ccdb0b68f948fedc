"""Case generators for the training engines (distributed.engines): Megatron-core DDP, Megatron-FSDP, DeepSpeed ZeRO
1-3, and TE's Linear with fuse_wgrad_accumulation under Megatron DDP.

Every case takes spec.iterations optimizer steps (te_verify.training). The grids cross the linear-stack freeze masks
with each engine's options and microbatches; the pr tier is their pairwise cover (te_verify.matrix.selection). Left out,
with reasons: all-frozen models (nothing to train: Megatron DDP and DeepSpeed refuse an optimizer with no
parameter), bf16 (matrix.dist: a sharded bf16 reduction needs its own reference).
"""
from __future__ import annotations

import dataclasses

from te_verify.matrix.tiers import NON_SQUARE4, check_tier, dedupe, named_masks
from te_verify.matrix.dist import MIDDLE, _spec, LORA_QV, _lora_spec
from te_verify.spec import TEConfig


def _masks(tier: str) -> list[tuple[bool, ...]]:
    masks = [m for k, m in named_masks(4).items() if k != "all"] + [MIDDLE]
    return masks if tier != "smoke" else [MIDDLE]


def _grid(family: str, wrapper: str, tier: str, option_sets: list[tuple], per_mask: int = 0) -> list:
    """nightly: every mask x option set, with and without the input's gradient. pr: each mask with `per_mask` of
    the option sets, rotating through them so that every set runs (the selection's pairwise cover takes an options
    tuple as one factor value, so it would keep the whole grid)."""
    masks = _masks(tier)
    if tier == "nightly":
        return dedupe([_spec(family, wrapper, m, x, o) for m in masks for x in (False, True) for o in option_sets])
    k = per_mask or len(option_sets)
    return dedupe([_spec(family, wrapper, m, True, option_sets[(i * k + j) % len(option_sets)])
                   for i, m in enumerate(masks) for j in range(min(k, len(option_sets)))])


def megatron_ddp_specs(tier: str) -> list:
    check_tier(tier)
    sets = [(("overlap_grad_reduce", overlap), ("bucket_size", bucket), ("use_distributed_optimizer", distopt),
             ("microbatches", mb)) for overlap in (False, True) for bucket in (None, 1000) for distopt in (False, True)
            for mb in (1, 2)]
    specs = _grid("dist_megatron_ddp", "megatron_ddp", tier, sets if tier != "smoke" else sets[:1], per_mask=4)
    if tier != "smoke":
        alt = named_masks(4)["alternating"]
        specs.append(_spec("dist_megatron_ddp", "megatron_ddp", alt, True, (("overlap_grad_reduce", True),),
                           NON_SQUARE4, bias=tuple(not b for b in alt)))
        specs += [_lora_spec("megatron_ddp", LORA_QV, options=(("overlap_grad_reduce", o),)) for o in (False, True)]
    return dedupe(specs)


def te_megatron_specs(tier: str) -> list:
    """TE's Linear with fuse_wgrad_accumulation (and the Megatron flag) under Megatron DDP: frozen patterns x
    microbatches x overlap. Every one is in the pr tier (the TE contract Megatron consumes, seed 002)."""
    check_tier(tier)
    te = TEConfig(main_grad=True, grad_added_to_main_grad=True)
    masks = _masks(tier)
    specs = [_spec("dist_te_megatron", "megatron_ddp", m, True, (("microbatches", mb), ("overlap_grad_reduce", o)))
             .replace(te=te) for m in masks for mb in ((1, 2) if tier != "smoke" else (2,))
             for o in ((False, True) if tier == "nightly" else (mb == 2,))]
    return dedupe(specs)


def megatron_fsdp_specs(tier: str) -> list:
    check_tier(tier)
    strategies = ("no_shard", "optim", "optim_grads", "optim_grads_params")
    # Accumulation with the default model auto-sync (sync every microbatch) and without it (sync at the last).
    sync = [(("microbatches", 1),), (("microbatches", 2),), (("microbatches", 2), ("sync_model_each_microbatch", False))]
    sets = {o: [tuple(sorted((("zero_dp_strategy", s), ("overlap", o), *m))) for s in strategies for m in sync]
            for o in (False, True)}
    if tier == "smoke":
        return _grid("dist_megatron_fsdp", "megatron_fsdp", tier, [sets[False][-1]])
    # pr draws one overlap set per mask: strategy first, so its five draws run every strategy with overlap.
    overlap = sets[True] if tier == "nightly" else sorted(sets[True], key=lambda o: sets[True].index(o) % len(sync))
    return dedupe(_grid("dist_megatron_fsdp", "megatron_fsdp", tier, sets[False], per_mask=4)
                  + _grid("dist_megatron_fsdp", "megatron_fsdp", tier, overlap, per_mask=1))


def deepspeed_specs(tier: str) -> list:
    check_tier(tier)
    specs = []
    for stage in (1, 2, 3):
        wrapper = f"deepspeed_zero{stage}"
        sets = [(("microbatches", mb),) for mb in (1, 2)]
        if stage == 3:  # persistent small parameters (DeepSpeed's default threshold) and none persistent
            sets = [s + extra for s in sets for extra in ((("persistence_threshold", 0),), ())]
        specs += _grid("dist_deepspeed", wrapper, tier, sets if tier != "smoke" else sets[:1], per_mask=stage // 3 + 1)
        if tier != "smoke":  # TE's Linear (high precision) under the same stage
            specs += [_spec("dist_deepspeed", wrapper, m, True, sets[0]).replace(te=TEConfig())
                      for m in (MIDDLE, named_masks(4)["alternating"])]
    return dedupe(specs)


def _policy(spec, reduce_dtype: str):
    return spec.replace(dist=dataclasses.replace(spec.dist, param_dtype="bf16", reduce_dtype=reduce_dtype))


# DeepSpeed's bf16 section as users configure it: (stage, options, reduce dtype). grad_accum_dtype fp32 with an fp32
# reduction; the default (bf16 accumulation, DeepSpeed's bf16 communication dtype). ZeRO-1 with fp32 accumulation
# runs DeepSpeed's BF16_Optimizer (deepspeedai/DeepSpeed#7985: two microbatches, the last one's reduction).
DS_POLICIES = [(1, (("grad_accum_dtype", "fp32"), ("microbatches", 2)), "fp32"),
               (2, (("grad_accum_dtype", "fp32"), ("microbatches", 2)), "fp32"),
               (1, (("grad_accum_dtype", "fp32"), ("microbatches", 1)), "fp32"),
               (1, (("microbatches", 1),), "bf16"),
               (3, (("grad_accum_dtype", "fp32"), ("microbatches", 1)), "fp32"),
               (2, (("microbatches", 2),), "bf16"),
               (3, (("microbatches", 2),), "bf16")]


def deepspeed_policy_specs(tier: str) -> list:
    """DeepSpeed ZeRO 1-3 under its bf16 section over fp32 parameters (engines.deepspeed_bf16): smoke the ZeRO-1
    BF16_Optimizer case, pr the first four policies (frozen middle layer, input grad), nightly every policy x mask
    with and without the input's gradient."""
    check_tier(tier)
    policies = DS_POLICIES[:1] if tier == "smoke" else DS_POLICIES[:4] if tier == "pr" else DS_POLICIES
    masks = [MIDDLE] if tier != "nightly" else _masks(tier)
    return dedupe([_policy(_spec("dist_deepspeed_bf16", f"deepspeed_zero{stage}", m, x, opts), reduce)
                   for stage, opts, reduce in policies for m in masks
                   for x in ((True,) if tier != "nightly" else (False, True))])


# Megatron-core DDP with bf16 parameters (Float16Module) and fp32 masters (engines.megatron_bf16): (options, reduce
# dtype), the reduce dtype giving grad_reduce_in_fp32 (fp32: fp32 main_grad, bf16: bf16 main_grad). The first three
# are the pr tier's: accumulation over two microbatches into an fp32 main_grad, a bf16 reduction, the distributed
# optimizer (fp32 master shards) with overlapped bucket reduction.
MEGATRON_POLICIES = [((("microbatches", 2),), "fp32"),
                     ((("microbatches", 1),), "bf16"),
                     ((("overlap_grad_reduce", True), ("use_distributed_optimizer", True)), "fp32"),
                     ((("bucket_size", 1000), ("overlap_grad_reduce", True)), "fp32"),
                     ((("microbatches", 2), ("use_distributed_optimizer", True)), "bf16"),
                     ((("microbatches", 2), ("overlap_grad_reduce", True)), "bf16")]


def megatron_policy_specs(tier: str) -> list:
    """Megatron-core DDP under a bf16 policy over fp32 parameters: smoke the first policy, pr the first three
    (frozen middle layer, input grad), nightly every policy x mask with and without the input's gradient."""
    check_tier(tier)
    policies = MEGATRON_POLICIES[:1] if tier == "smoke" else MEGATRON_POLICIES[:3] if tier == "pr" \
        else MEGATRON_POLICIES
    masks = [MIDDLE] if tier != "nightly" else _masks(tier)
    return dedupe([_policy(_spec("dist_megatron_bf16", "megatron_ddp", m, x, opts), reduce)
                   for opts, reduce in policies for m in masks for x in ((True,) if tier != "nightly" else (False, True))])


# Megatron-FSDP with bf16 parameters and fp32 main weights and grads (engines.megatron_fsdp_bf16): (options, reduce
# dtype), the reduce dtype giving grad_comm_dtype. The first two are the pr tier's (pairwise over strategy x reduce
# dtype x accumulation): fully sharded, two microbatches reduce-scattered in fp32 into the fp32 main grads; gradients
# sharded, one microbatch reduce-scattered in bf16. "optim" is left out: without overlap it crashes on a frozen
# parameter and with model auto-sync over microbatches it corrupts them (expectations/megatron_fsdp.toml), so a policy
# case of it would judge nothing new.
FSDP_POLICIES = [((("microbatches", 2), ("zero_dp_strategy", "optim_grads_params")), "fp32"),
                 ((("microbatches", 1), ("zero_dp_strategy", "optim_grads")), "bf16"),
                 ((("microbatches", 1), ("zero_dp_strategy", "optim_grads_params")), "bf16"),
                 ((("microbatches", 2), ("overlap", True), ("zero_dp_strategy", "optim_grads")), "fp32"),
                 ((("microbatches", 2), ("sync_model_each_microbatch", False), ("zero_dp_strategy", "no_shard")),
                  "fp32"),
                 ((("microbatches", 1), ("zero_dp_strategy", "no_shard")), "bf16")]


def megatron_fsdp_policy_specs(tier: str) -> list:
    """Megatron-FSDP under a bf16 policy over fp32 parameters: smoke the first policy, pr the first two (frozen
    middle layer, input grad), nightly every policy x mask with and without the input's gradient."""
    check_tier(tier)
    policies = FSDP_POLICIES[:1] if tier == "smoke" else FSDP_POLICIES[:2] if tier == "pr" else FSDP_POLICIES
    masks = [MIDDLE] if tier != "nightly" else _masks(tier)
    return dedupe([_policy(_spec("dist_megatron_fsdp_bf16", "megatron_fsdp", m, x, opts), reduce)
                   for opts, reduce in policies for m in masks for x in ((True,) if tier != "nightly" else (False, True))])


FAMILIES = {
    "dist_megatron_ddp": megatron_ddp_specs,
    "dist_te_megatron": te_megatron_specs,
    "dist_megatron_fsdp": megatron_fsdp_specs,
    "dist_deepspeed": deepspeed_specs,
    "dist_deepspeed_bf16": deepspeed_policy_specs,
    "dist_megatron_bf16": megatron_policy_specs,
    "dist_megatron_fsdp_bf16": megatron_fsdp_policy_specs,
}
