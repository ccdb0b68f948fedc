"""Case generators for the TE lane, by family and tier (smoke / pr / nightly).

FP8 GEMMs need the last dim divisible by 16 and the rows by 8, so FP8 stacks use widths 16/32/64/128;
`fp8_specs` adds one error-input case (width 24) where TE raises. Freeze patterns follow the torch lane:
all 16 masks of 4 layers, alternating, prefix/suffix, and the non-square 32->64->128->64->32 stack.
"""
from __future__ import annotations

from typing import Callable

from te_verify.matrix.te_masks import MOE_MIX, MOE_ONE, split_mask_specs
from te_verify.matrix.te_norms import mlp_specs, norm_specs
from te_verify.matrix.te_orders import order_specs
from te_verify.matrix.te_recompute import te_recompute_specs
from te_verify.matrix.tiers import (BF16_MOE_ROWS, BF16_MOE_WIDTHS, BF16_ROWS, BF16_STACK, all_masks, check_tier,
                                    dedupe, named_masks)
from te_verify.spec import CaseSpec, ModelConfig, TEConfig

NON_SQUARE4 = (32, 64, 128, 64, 32)
SQUARE4 = (32, 32, 32, 32, 32)
NARROW4 = (16, 32, 64, 32, 16)
FP8_ERROR_WIDTHS = (32, 24, 32)  # 24 is not a multiple of 16: TE refuses the FP8 GEMM
RECIPES = ("delayed", "current")
CONFIGS = ((False, False, False), (True, False, False), (False, True, False), (False, True, True),
           (True, True, False), (True, True, True))  # (delay_wgrad, main_grad, grad_added_to_main_grad)


# BitFit-style training: the weights frozen, the biases trained. Frozen weights with trainable biases are a freeze
# pattern of their own in every TE family (TE's high-precision Linear computes a bias gradient only inside the wgrad
# GEMM it skips for a frozen weight: expectations/te_eager.toml).
BIAS_TRAINED = (False, False, False, False)


def bitfit(family: str, widths: tuple[int, ...], recipes: tuple, x_grads: tuple = (False, True), **spec) -> list[CaseSpec]:
    """Every weight frozen and every bias trained, over `recipes` and input-gradient needs."""
    te = spec.pop("te", {})
    return [CaseSpec(family, widths, named_masks(4)["all"], BIAS_TRAINED, x, spec.pop("batch_shape", (16,)),
                     te=TEConfig(recipe=r, **te), **spec) for r in recipes for x in x_grads]


# The block-scaled recipes (issue 26) and what each needs of a case: MXFP8 blocks of 32 along the rows too (32 rows),
# NVFP4's random Hadamard transform a bf16 input (TE: "RHT is only supported for bfloat16 input"). "nvfp4" is TE's
# default NVFP4BlockScaling, gradients rounded stochastically (judged by stochastic rounding's contract,
# checks.nvfp4_sr, against the reference replaying the run's rounding choices); "nvfp4_rn" is NVFP4BlockScaling
# without stochastic rounding; "custom" is CustomRecipe over TE's high_precision_fwd_mxfp8_bwd_factory (MXFP8 GEMMs).
# MXFP8, NVFP4 and the custom factory need emulated sm100 (--te-capability sm100; they skip with TE's reason below it).
BLOCK_RECIPES = ("block", "mxfp8", "nvfp4_rn", "custom", "nvfp4")
BLOCK_NEEDS = {"block": {}, "mxfp8": {"batch_shape": (32,)}, "nvfp4_rn": {"dtype": "bf16"},
               "custom": {"batch_shape": (32,)}, "nvfp4": {"dtype": "bf16"}}
# Recipes whose pr case only families passing `pr_all` draw (the pr tier's time budget; every family in nightly):
# stochastic rounding's pr case is te_fp8's.
NIGHTLY_ONLY = ("nvfp4",)


def block_te(recipe: str, **te) -> TEConfig:
    """A TEConfig of a block-scaled recipe (the custom one over its zoo factory)."""
    return TEConfig(recipe=recipe, qfactory="high_precision_fwd_mxfp8_bwd_factory" if recipe == "custom" else "", **te)


def block_spec(family: str, recipe: str, widths: tuple[int, ...], weight_frozen, bias_frozen, x_grad: bool,
               te: dict | None = None, **spec) -> CaseSpec:
    """A case of `family` under a block-scaled recipe, on the rows (per expert) and dtype the recipe needs."""
    needs, te = dict(BLOCK_NEEDS[recipe]), dict(te or {})
    rows = spec.pop("batch_shape", (16,))
    if "batch_shape" in needs:
        rows = (needs.pop("batch_shape")[0] * te.get("experts", 1),)
    return CaseSpec(family, widths, weight_frozen, bias_frozen, x_grad, rows, te=block_te(recipe, **te),
                    **needs, **spec)


def block_specs(tier: str, pr: Callable[[str], CaseSpec], nightly: Callable[[str], list[CaseSpec]],
                recipes: tuple[str, ...] = BLOCK_RECIPES, pr_all: bool = False) -> list[CaseSpec]:
    """A family's block-scaled cases: recipe is a pairwise factor, so the pr tier holds one case per recipe (`pr`;
    NIGHTLY_ONLY's only with `pr_all`), the nightly tier every recipe's and `nightly`'s (smoke: none)."""
    if tier == "smoke":
        return []
    specs = [pr(r) for r in recipes if tier == "nightly" or pr_all or r not in NIGHTLY_ONLY]
    return specs + [s for r in recipes for s in nightly(r)] if tier == "nightly" else specs




UNRESOLVED_BF16_MASKS = ((False, False, True, True), (False, True, True, False))
UNRESOLVED_BF16_REPLAYS = (("alternating", 3),)


def bf16_stack(family: str, weight_frozen: tuple[bool, ...], bias_frozen, x_grad: bool, te: dict | None = None,
               **spec) -> CaseSpec:
    """A high-precision bf16 stack case of `family`, sized to resolve a 1% lean (BF16_STACK over BF16_ROWS)."""
    return CaseSpec(family, BF16_STACK, weight_frozen, bias_frozen, x_grad, BF16_ROWS, "bf16",
                    te=TEConfig(**(te or {})), **spec)


def _patterns(tier: str) -> tuple[str, ...]:
    return ("alternating",) if tier == "smoke" else ("alternating", "prefix", "suffix", "none")


def fp8_specs(tier: str) -> list[CaseSpec]:
    """FP8 parity: stacks x freeze patterns x recipes (E4M3; HYBRID on the non-square stack), input with grad; plus
    the error-input case."""
    check_tier(tier)
    stacks = (NON_SQUARE4,) if tier == "smoke" else (NON_SQUARE4, SQUARE4, NARROW4)
    specs = [CaseSpec("te_fp8", w, named_masks(4)[p], named_masks(4)[p], True, (16,), te=TEConfig(recipe=r))
             for w in stacks for p in _patterns(tier) for r in RECIPES]
    if tier != "smoke":  # issue 3: E4M3 forward, E5M2 gradients under the HYBRID format
        specs += [CaseSpec("te_fp8", NON_SQUARE4, named_masks(4)[p], named_masks(4)[p], True, (16,),
                           te=TEConfig(recipe=r, fp8_format="HYBRID")) for p in ("alternating", "none") for r in RECIPES]
    if tier == "nightly":
        specs += [CaseSpec("te_fp8", NON_SQUARE4, m, m, x, (2, 8), te=TEConfig(recipe=r, fp8_format=f), seed=s)
                  for m in all_masks(4) for x in (False, True) for r in RECIPES for f in ("E4M3", "HYBRID")
                  for s in (0, 1)]
        specs += history_specs("te_fp8")
    specs.append(CaseSpec("te_fp8", FP8_ERROR_WIDTHS, (False, False), (False, False), True, (16,), te=TEConfig(recipe="delayed")))
    if tier != "smoke":
        specs += bitfit("te_fp8", NON_SQUARE4, RECIPES)
    masks = named_masks(4)
    specs += block_specs(tier, lambda r: block_spec("te_fp8", r, NON_SQUARE4, masks["alternating"],
                                                    masks["alternating"], True),
                         lambda r: [block_spec("te_fp8", r, w, masks[p], masks[p], x)
                                    for w in (NON_SQUARE4, SQUARE4) for p in ("prefix", "suffix", "none")
                                    for x in (False, True)]
                         + [block_spec("te_fp8", r, NON_SQUARE4, masks["all"], BIAS_TRAINED, x) for x in (False, True)],
                         pr_all=True)
    specs += split_mask_specs(tier, "te_fp8", NON_SQUARE4, [dict(recipe=r) for r in RECIPES])
    specs += te_recompute_specs("te_fp8", tier)  # TE's checkpoint under the FP8 recipes (issue 34)
    return dedupe(specs)


# Delayed scaling's amax history rolls within a case: a history of HISTORY_LEN entries over HISTORY_LEN + 2 iterations
# (every entry replaced at least once: the recipe's roll and its max over the window are both judged, fp8_scaling).
HISTORY_LEN = 2


def history_specs(family: str, microbatches: int = 1) -> list[CaseSpec]:
    """Nightly: delayed scaling with a short amax history, trained past it (E4M3 and HYBRID)."""
    te = dict(delay_wgrad=True, microbatches=microbatches) if family == "te_delayed" else {}
    return [CaseSpec(family, NARROW4 if te else NON_SQUARE4, named_masks(4)[p], named_masks(4)[p], True, (16,),
                     te=TEConfig(recipe="delayed", fp8_format=f, amax_history_len=HISTORY_LEN, **te),
                     iterations=HISTORY_LEN + 2)
            for p in ("alternating", "none") for f in ("E4M3", "HYBRID")]


def peft_specs(tier: str) -> list[CaseSpec]:
    """PEFT (seed 000): every freeze mask of the non-square stack, input with and without grad, FP8 delayed."""
    check_tier(tier)
    masks = list(named_masks(4).values()) if tier == "smoke" else all_masks(4)
    xs = (False,) if tier == "smoke" else (False, True)
    specs = [CaseSpec("te_peft", NON_SQUARE4, m, m, x, (16,), te=TEConfig(recipe="delayed")) for m in masks for x in xs]
    if tier != "smoke":
        specs += [CaseSpec("te_peft", SQUARE4, named_masks(4)[p], None, False, (16,), te=TEConfig(recipe="current"))
                  for p in ("alternating", "prefix", "suffix")]
        specs += [CaseSpec("te_peft", NON_SQUARE4, named_masks(4)[p], named_masks(4)[p], False, (16,),
                           freeze_timing=t, te=TEConfig(recipe="delayed"))
                  for p in ("alternating", "prefix") for t in ("after", "unfreeze_after")]
        specs += bitfit("te_peft", NON_SQUARE4, (None, "delayed"))
    # Without biases: TE issue 1693's case (a frozen weight's layer makes no columnwise grad_output copy).
    specs += block_specs(tier, lambda r: block_spec("te_peft", r, NON_SQUARE4, named_masks(4)["alternating"], None,
                                                    False),
                         lambda r: [block_spec("te_peft", r, NON_SQUARE4, m, b, x) for m in named_masks(4).values()
                                    for b in (m, None) for x in (False, True)])
    specs += split_mask_specs(tier, "te_peft", NON_SQUARE4, [dict(recipe=r) for r in (None, "delayed")], mix=1)
    specs += norm_specs(tier, "te_peft", NON_SQUARE4)  # LayerNormLinear layers (issue 36 item 4)
    specs += mlp_specs(tier, "te_peft")  # LayerNormMLP pairs (issue 36 item 4)
    # bf16 (issue 34): every mask and input-gradient need in high precision, a pairwise factor of the pr choice; not
    # the masks training only the first layers (0011, 0110): their first biases' allowance reaches 1.2% from the second
    # iteration on at BF16_STACK's size (grad_scale_resolution fails), so a 1% lean there would pass as noise.
    if tier != "smoke":
        specs += [bf16_stack("te_peft", m, m, x) for m in masks for x in xs if m not in UNRESOLVED_BF16_MASKS]
    specs += te_recompute_specs("te_peft", tier)  # torch's and TE's checkpoints around pairs of TE Linears (issue 34)
    return dedupe(specs)


def replay_specs(tier: str) -> list[CaseSpec]:
    """Replays (seed 001): 2 and 3 backward passes with retain_graph=True, FP8 recipes and high precision."""
    check_tier(tier)
    replays = (2,) if tier == "smoke" else (2, 3)
    recipes = ("delayed",) if tier == "smoke" else ("delayed", "current", None)
    patterns = ("alternating",) if tier == "smoke" else ("alternating", "prefix")
    specs = [CaseSpec("te_replay", NON_SQUARE4, named_masks(4)[p], named_masks(4)[p], True, (16,), replays=r,
                      te=TEConfig(recipe=rec)) for p in patterns for r in replays for rec in recipes]
    if tier != "smoke":
        specs += bitfit("te_replay", NON_SQUARE4, (None, "delayed"), (True,), replays=2)
        # bf16 (issue 34), but for the alternating mask over 3 replays: its 1.bias's allowance passes 1% at iteration
        # 3 at BF16_STACK's size (grad_scale_resolution fails on eager's own noise), so a 1% lean there would pass.
        specs += [bf16_stack("te_replay", named_masks(4)[p], named_masks(4)[p], True, replays=r)
                  for p in patterns for r in replays if (p, r) not in UNRESOLVED_BF16_REPLAYS]
    specs += block_specs(tier, lambda r: block_spec("te_replay", r, NON_SQUARE4, named_masks(4)["alternating"],
                                                    named_masks(4)["alternating"], True, replays=2),
                         lambda r: [block_spec("te_replay", r, NON_SQUARE4, named_masks(4)["prefix"],
                                               named_masks(4)["prefix"], True, replays=3)])
    specs += split_mask_specs(tier, "te_replay", NON_SQUARE4, [dict(recipe=r) for r in (None, "delayed")], x_grads=(True,),
                              replays=2)
    return dedupe(specs)


def contract_specs(tier: str) -> list[CaseSpec]:
    """Contract (seed 002): module kind x config x 2/3 microbatches (high precision; te_eager)."""
    check_tier(tier)
    kinds = ("linear",) if tier == "smoke" else ("linear", "grouped_linear", "ops_linear", "ops_grouped_linear",
                                                 "grouped_mlp")
    mbs = (2,) if tier == "smoke" else (2, 3)
    mask = (False, True, False, False)
    specs = [CaseSpec("te_contract", NARROW4, mask, mask, True, (16,), te=TEConfig(None, kind, mg, added, delay, mb))
             for kind in kinds for delay, mg, added in CONFIGS for mb in mbs]
    if tier != "smoke":  # the frozen layer's bias trained
        specs += [CaseSpec("te_contract", NARROW4, mask, BIAS_TRAINED, True, (16,),
                           te=TEConfig(None, kind, mg, added, delay, 2))
                  for kind in kinds for delay, mg, added in CONFIGS[:2]]
    specs += split_mask_specs(tier, "te_contract", NARROW4, [dict(module=k, delay_wgrad=d, main_grad=mg, microbatches=2,
                                                                  grad_added_to_main_grad=a)
                                                             for k in kinds for d, mg, a in CONFIGS], mix=1, x_grads=(True,))
    orders = kinds if tier == "nightly" else kinds[:2]  # pr: Linear and GroupedLinear, every config (item 5)
    specs += order_specs(tier, "te_contract", NARROW4, [dict(module=k, delay_wgrad=d, main_grad=mg, microbatches=mb,
                                                             grad_added_to_main_grad=a)
                                                        for k in orders for d, mg, a in CONFIGS for mb in mbs])
    return dedupe(specs)


def delayed_specs(tier: str) -> list[CaseSpec]:
    """Delayed wgrad: backward_dw() with frozen weights, accumulation over 1-3 calls, FP8 and high precision."""
    check_tier(tier)
    patterns = ("alternating",) if tier == "smoke" else ("alternating", "prefix", "suffix", "none", "all")
    mbs = (2,) if tier == "smoke" else (1, 2, 3)
    recipes = (None,) if tier == "smoke" else (None, "delayed")
    specs = []
    for p in patterns:
        mask = named_masks(4)[p]
        for mb in mbs:
            for rec in recipes:
                specs.append(CaseSpec("te_delayed", NARROW4, mask, mask, p == "all", (16,),
                                      te=TEConfig(rec, "linear", delay_wgrad=True, microbatches=mb)))
    if tier != "smoke":
        specs += bitfit("te_delayed", NARROW4, recipes, te=dict(module="linear", delay_wgrad=True, microbatches=2))
        specs += [bf16_stack("te_delayed", named_masks(4)[p], named_masks(4)[p], p == "all",  # bf16 (issue 34)
                             te=dict(module="linear", delay_wgrad=True, microbatches=mb))
                  for p in patterns for mb in mbs]
    if tier == "nightly":
        specs += history_specs("te_delayed", microbatches=2)
    dw = lambda mb: dict(module="linear", delay_wgrad=True, microbatches=mb)  # noqa: E731
    # MXFP8 needs widths divisible by 32; the custom factory's delayed wgrad reaches a CUDA call the emulation lacks
    # ("Cannot access accelerator device"), so it is not among these.
    widths = lambda r: NON_SQUARE4 if r == "mxfp8" else NARROW4  # noqa: E731
    specs += block_specs(tier, lambda r: block_spec("te_delayed", r, widths(r), named_masks(4)["alternating"],
                                                    named_masks(4)["alternating"], False, te=dw(2)),
                         lambda r: [block_spec("te_delayed", r, widths(r), named_masks(4)[p], named_masks(4)[p],
                                               p == "all", te=dw(mb)) for p in ("prefix", "none", "all")
                                    for mb in (1, 3)], recipes=(*BLOCK_RECIPES[:3], "nvfp4"))
    # Tied weights (TE issue 3437): layers 1 and 2 share one weight, each use queues its own wgrad.
    tied_mbs = (1,) if tier == "smoke" else (1, 2)
    specs += [CaseSpec("te_delayed", SQUARE4, named_masks(4)["none"], named_masks(4)["none"], True, (16,),
                       te=TEConfig(rec, "linear", delay_wgrad=True, microbatches=mb, tied=(1, 2)))
              for mb in tied_mbs for rec in recipes]
    specs += split_mask_specs(tier, "te_delayed", NARROW4, [dict(recipe=r, delay_wgrad=True, microbatches=mb)
                                                            for r in (None, "delayed") for mb in (1, 2)])
    specs += order_specs(tier, "te_delayed", NARROW4, [dict(recipe=r, delay_wgrad=True, microbatches=mb)
                                                       for r in recipes for mb in mbs if mb > 1])
    return dedupe(specs)


MOE_WIDTHS = (32, 32)
MOE_ROWS = (64,)  # 16 rows per expert: an FP8 wgrad GEMM reduces over the rows, which must be a multiple of 16


def moe_specs(tier: str) -> list[CaseSpec]:
    """MoE PEFT: one TE GroupedLinear of 4 experts (equal row shares), a subset of experts frozen."""
    check_tier(tier)
    frozen = ((1,), ()) if tier == "smoke" else ((1,), (0, 2), (), (0, 1, 2, 3))
    recipes = ("delayed",) if tier == "smoke" else ("delayed", None)
    modules = ("grouped_linear",) if tier == "smoke" else ("grouped_linear", "ops_grouped_linear")
    xs = (False,) if tier == "smoke" else (False, True)
    specs = [CaseSpec("te_moe", MOE_WIDTHS, (False,), (False,), x, MOE_ROWS, te=TEConfig(rec, module, experts=4,
                                                                                      frozen_experts=f))
             for f in frozen for rec in recipes for module in modules for x in xs]
    if tier != "smoke":  # bf16 (issue 34), high precision, sized to resolve a 1% lean (BF16_MOE_WIDTHS over its rows)
        specs += [CaseSpec("te_moe", BF16_MOE_WIDTHS, (False,), (False,), x, BF16_MOE_ROWS, "bf16",
                           te=TEConfig(None, module, experts=4, frozen_experts=f))
                  for f in frozen for module in modules for x in xs]
    if tier != "smoke":  # every expert's weight frozen, its bias trained
        specs += [CaseSpec("te_moe", MOE_WIDTHS, (True,), (False,), x, MOE_ROWS, te=TEConfig(rec, module, experts=4))
                  for rec in recipes for module in modules for x in xs]
    moe = lambda f: dict(module="grouped_linear", experts=4, frozen_experts=f)  # noqa: E731
    specs += block_specs(tier, lambda r: block_spec("te_moe", r, MOE_WIDTHS, (False,), (False,), True,
                                                    te=moe((1,)), batch_shape=MOE_ROWS),
                         lambda r: [block_spec("te_moe", r, MOE_WIDTHS, (False,), (False,), x, te=moe(f),
                                               batch_shape=MOE_ROWS) for f in ((0, 2), (), (0, 1, 2, 3))
                                    for x in (False, True)])
    split = [dict(recipe=r, module=m, experts=4) for r in (None, "delayed") for m in ("grouped_linear", "ops_grouped_linear")]
    specs += [s for w, m in ((MOE_WIDTHS, MOE_ONE), (MOE_WIDTHS + (32,), MOE_MIX))
              for s in split_mask_specs(tier, "te_moe", w, split, masks=(m,), batch_shape=MOE_ROWS)]
    return dedupe(specs)


LORA_TARGETS = {"qv": ("q", "v"), "attn": ("q", "k", "v", "o"), "mlp": ("fc_1", "fc_2", "proj"),
                "all": ("q", "k", "v", "o", "fc_1", "fc_2", "proj")}


LORA_SEQ = 8  # tokens per sequence; a case's batch is (rows // LORA_SEQ, LORA_SEQ)


def _lora(targets: str, x_grad: bool, dtype: str, recipe: str | None = None, blocks: int = 1,
          seed: int = 0, kind: str = "llama", rows: int = 16) -> CaseSpec:
    tokens = kind == "litgpt_lora"  # LitGPT's GPT takes token ids and ends in its head
    model = ModelConfig(kind, blocks=blocks, lora_on=LORA_TARGETS[targets], te_base=True, embedding=tokens,
                        head=tokens)
    te = block_te(recipe) if recipe in BLOCK_RECIPES else TEConfig(recipe=recipe)
    return CaseSpec("te_lora", (model.in_width, model.out_width), (), None, x_grad, (rows // LORA_SEQ, LORA_SEQ),
                    dtype, model=model, te=te, seed=seed)


def _lora_block(recipe: str, targets: str, x_grad: bool, **lora) -> CaseSpec:
    """A te_lora case under a block-scaled recipe, on the tokens and dtype it needs (BLOCK_NEEDS: MXFP8's 32 rows as
    (4, 8), NVFP4's bf16); fp32 otherwise. The models' widths (32, 64) are multiples of MXFP8's 32-blocks."""
    needs = BLOCK_NEEDS[recipe]
    rows = needs.get("batch_shape", (16,))[0]
    return _lora(targets, x_grad, needs.get("dtype", "fp32"), recipe, rows=rows, **lora)


def te_lora_specs(tier: str) -> list[CaseSpec]:
    """LoRA over TE Linear (issue 12): Llama blocks (in nightly also transformers + peft's and LitGPT's models, issue
    19) whose adapters' bases are TE Linears (frozen), the adapters torch's; high precision in fp32 and bf16, FP8
    (delayed, current scaling) in fp32, and the block-scaled recipes on what each needs (NVFP4: bf16). One backward
    pass: TE frees its saved state in the first backward (TE issue 990), so replays are the te_replay family's."""
    check_tier(tier)
    if tier == "smoke":
        return [_lora("qv", True, "fp32"), _lora("all", False, "bf16")]
    # pr: five specs and one per block-scaled recipe (thunder_te compiles each in about 6 s on 2 cores); nightly:
    # every target, x_grad and dtype. bf16 Llama blocks are nightly's: correct implementations lean about 1% apart
    # there, so grad_scale cannot resolve a 1% lean at any size the pr tier affords (docs/tolerances.md).
    specs = [_lora("qv", True, "fp32"), _lora("qv", False, "fp32"), _lora("all", True, "fp32"),
             _lora("qv", True, "fp32", "delayed"), _lora("all", True, "fp32", "current")]
    if tier == "nightly":  # about 6 s per thunder_te case: the other targets and recipes, 2 blocks once
        specs.append(_lora("all", False, "bf16"))
        specs += [_lora(t, True, d) for t, d in (("attn", "fp32"), ("mlp", "bf16"))]
        specs += [_lora(t, False, "fp32", r) for t, r in (("attn", "delayed"), ("mlp", "current"))]
        specs.append(_lora("all", True, "fp32", blocks=2))
        # The library-model families (issue 19): peft's base_layer and LitGPT's linear as TE Linears.
        for kind in ("hf_peft", "litgpt_lora"):
            x_grad = kind == "hf_peft"  # hidden states in; LitGPT's token ids need no grad
            specs += [_lora("qv", x_grad, "fp32", kind=kind), _lora("all", False, "bf16", kind=kind),
                      _lora("all", x_grad, "fp32", "delayed", kind=kind),
                      _lora("qv", x_grad, "fp32", "current", kind=kind)]
    # Block-scaled recipes (issue 26), a pairwise factor: pr one case each; nightly the other targets and input
    # gradient, and each library model kind.
    specs += block_specs(tier, lambda r: _lora_block(r, "qv", True),
                         lambda r: [_lora_block(r, "all", False), _lora_block(r, "mlp", True),
                                    _lora_block(r, "all", True, kind="hf_peft"),
                                    _lora_block(r, "all", False, kind="litgpt_lora")])
    return dedupe(specs)


FAMILIES = {"te_fp8": fp8_specs, "te_peft": peft_specs, "te_replay": replay_specs,
            "te_contract": contract_specs, "te_delayed": delayed_specs, "te_moe": moe_specs,
            "te_lora": te_lora_specs}
