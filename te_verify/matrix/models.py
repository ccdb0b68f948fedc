"""Case generators for the model families (spec.model) on the torch lane, by tier, plus a hypothesis strategy.

Small widths (n_embd 32, 4 heads, MLP 64) and a (2, 8) batch: the cost of a case is thunder's trace of the
block's Python (about 3 s per block on 2 cores), not its arithmetic, so most cases use one block.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from te_verify.matrix.tiers import GENERATED_MODEL, check_tier, dedupe
from te_verify.spec import PROJECTIONS, CaseSpec, ModelConfig

LORA_TARGETS = {
    "qv": ("q", "v"),  # LitGPT's default LoRA targets
    "k": ("k",),
    "qk": ("q", "k"),
    "vo": ("v", "o"),
    "attn": ("q", "k", "v", "o"),
    "mlp": ("fc_1", "fc_2", "proj"),
    "all": PROJECTIONS,
}
BATCH = (2, 8)


def model_spec(family: str, cfg: ModelConfig, x_grad: bool = False, **changes) -> CaseSpec:
    """A family spec with the widths its config implies."""
    return CaseSpec(family, (cfg.in_width, cfg.out_width), (), None, x_grad, BATCH, model=cfg).replace(**changes)


def lora_specs(tier: str) -> list[CaseSpec]:
    """LoRA on attention, the MLP or every projection; norms frozen or trained; replays, bf16, frozen stages."""
    check_tier(tier)
    lora = {name: ModelConfig(lora_on=targets) for name, targets in LORA_TARGETS.items()}
    if tier == "smoke":
        return [model_spec("lora", lora["qv"]), model_spec("lora", lora["all"], True)]
    # pr: the cheap targets (q, v) carry the variations; thunder traces a block with adapters everywhere in ~5 s.
    specs = [model_spec("lora", ModelConfig(lora_on=LORA_TARGETS["qv"], frozen=norms), x)
             for norms in ((), ("norms",)) for x in (False, True)]
    specs += [model_spec("lora", lora[n], x) for n in ("attn", "mlp", "all") for x in (False, True)]
    specs += [model_spec("lora", lora["qv"], True, dtype="bf16"), model_spec("lora", lora["all"], False, dtype="bf16")]
    specs += [model_spec("lora", lora[n], True, replays=2) for n in ("qv", "mlp")]
    specs.append(model_spec("lora", lora["all"], False, replays=2, warmup_steps=1))
    specs += [model_spec("lora", ModelConfig(lora_on=LORA_TARGETS["qv"], lora_rank=r, lora_alpha=2 * r), True)
              for r in (1, 8)]
    specs.append(model_spec("lora", lora["mlp"], True, seed=1))
    specs.append(model_spec("lora", ModelConfig(blocks=2, frozen_blocks=1, lora_on=LORA_TARGETS["qv"])))
    specs.append(model_spec("lora", ModelConfig(lora_on=LORA_TARGETS["qv"], embedding=True, head=True,
                                                frozen=("embedding", "head"))))
    if tier == "nightly":
        specs += [model_spec("lora", ModelConfig(blocks=2, lora_on=t, lora_rank=r, lora_alpha=2 * r), True, dtype=d)
                  for t, r, d in ((LORA_TARGETS["attn"], 1, "fp32"), (LORA_TARGETS["mlp"], 8, "bf16"))]
        specs += [model_spec("lora", ModelConfig(lora_on=t, frozen=("norms",)), x)
                  for t, x in ((LORA_TARGETS["attn"], False), (LORA_TARGETS["mlp"], False), (PROJECTIONS, True))]
    return dedupe(specs)


def stage_specs(tier: str) -> list[CaseSpec]:
    """Full fine-tuning with frozen stages: the first k blocks, the embedding, the head, the norms."""
    check_tier(tier)
    head = dict(embedding=True, head=True)
    if tier == "smoke":
        return [model_spec("stages", ModelConfig(blocks=2, frozen_blocks=1))]
    specs = [model_spec("stages", ModelConfig(frozen=norms), x) for norms in ((), ("norms",)) for x in (False, True)]
    specs += [model_spec("stages", ModelConfig(blocks=2, frozen_blocks=k)) for k in (1, 2)]
    specs.append(model_spec("stages", ModelConfig(), True, dtype="bf16"))
    specs += [model_spec("stages", ModelConfig(), True, replays=2), model_spec("stages", ModelConfig(), True, seed=1),
              model_spec("stages", ModelConfig(frozen=("norms",)), True, dtype="bf16", replays=2),
              model_spec("stages", ModelConfig(**head)), model_spec("stages", ModelConfig(frozen=("norms",)), seed=2),
              model_spec("stages", ModelConfig(frozen=("head",), **head), dtype="bf16"),
              model_spec("stages", ModelConfig(), replays=3)]
    specs += [model_spec("stages", ModelConfig(frozen=f, **head))
              for f in (("embedding",), ("head",), ("embedding", "head"), ("embedding", "head", "norms"))]
    specs += [model_spec("stages", ModelConfig(blocks=2, frozen_blocks=1), freeze_timing=t)
              for t in ("after", "unfreeze_after")]
    if tier == "nightly":
        specs += [model_spec("stages", ModelConfig(blocks=2, frozen_blocks=k, frozen=f, **head), dtype=d,
                             replays=1 + k % 2)
                  for k, f, d in ((0, (), "bf16"), (1, ("embedding", "norms"), "bf16"), (2, (), "fp32"))]
    return dedupe(specs)


PEFT_STAGES = ("embedding", "head", "norms")  # get_peft_model / mark_only_lora_as_trainable: only adapters train


def real_model_spec(kind: str, lora: str | None, x_grad: bool = False, tokens: bool = True, **changes) -> CaseSpec:
    """A spec of a family built from a library's model (the family is named by its kind): adapters on
    LORA_TARGETS[lora] (none: full fine-tuning); token ids in and logits out, or hidden states both ways; the other
    keywords set ModelConfig fields where it has them, else CaseSpec fields."""
    fields = {k: changes.pop(k) for k in list(changes) if k in ModelConfig.__dataclass_fields__}
    cfg = ModelConfig(kind=kind, lora_on=LORA_TARGETS[lora] if lora else (), embedding=tokens, head=tokens, **fields)
    return model_spec(kind, cfg, x_grad, **changes)


def hf_peft_specs(tier: str) -> list[CaseSpec]:
    """transformers' Llama under peft's LoRA (te_verify/models/hf_peft.py): token ids with the LM head or hidden
    states without it, adapters on chosen projections with the rest as PEFT leaves it or stages trained, PEFT's
    layers_to_transform, full fine-tuning with frozen stages; dtypes, replays, warm-up, freeze timing."""
    check_tier(tier)
    hf = functools.partial(real_model_spec, "hf_peft", tokens=False)
    if tier == "smoke":
        return [hf("qv", tokens=True, frozen=PEFT_STAGES)]
    # pr: four candidates (thunder compiles transformers' Llama in 14-27 s; see cases/test_hf_peft.py).
    specs = [hf("qv", tokens=True, frozen=PEFT_STAGES), hf("all", True, dtype="bf16"),
             hf("qv", True, blocks=2, frozen_blocks=1, replays=2),
             hf(None, tokens=True, frozen=("embedding",), freeze_timing="after")]
    if tier == "nightly":
        specs += [hf(t, tokens=True, frozen=PEFT_STAGES) for t in ("attn", "mlp", "all")]
        specs += [hf(t, x) for t in ("qv", "attn", "mlp") for x in (False, True)]
        specs += [hf("qv", True, frozen=("norms",), lora_rank=r, lora_alpha=2 * r) for r in (1, 8)]
        specs += [hf("mlp", tokens=True, frozen=("embedding", "head"), dtype="bf16"),
                  hf("qv", True, replays=3), hf("attn", True, warmup_steps=1, replays=2),
                  hf("qv", tokens=True, frozen=PEFT_STAGES, freeze_timing="unfreeze_after"),
                  hf("all", True, blocks=2, frozen_blocks=1, dtype="bf16"), hf("qv", True, seed=1),
                  hf(None, True), hf(None, tokens=True, frozen=("head", "norms"), replays=2),
                  hf(None, True, blocks=2, frozen_blocks=1, dtype="bf16")]
    return dedupe(specs)


def litgpt_lora_specs(tier: str) -> list[CaseSpec]:
    """LitGPT's litgpt.lora.GPT (te_verify/models/litgpt_lora.py): token ids in, logits out; LoRA on the fused qkv
    (a grouped conv1d for B), the projection and the MLP, with the rest frozen as mark_only_lora_as_trainable
    leaves it or stages trained; full fine-tuning with frozen stages; dtypes, replays, warm-up, freeze timing."""
    check_tier(tier)
    lit = functools.partial(real_model_spec, "litgpt_lora", x_grad=False)
    if tier == "smoke":
        return [lit("qv", frozen=PEFT_STAGES)]
    specs = [lit("qv", frozen=PEFT_STAGES), lit("all", dtype="bf16"),
             lit("attn", blocks=2, frozen_blocks=1, replays=2, frozen=("norms",)),
             lit(None, frozen=("embedding",), freeze_timing="after")]
    if tier == "nightly":
        specs += [lit(t, frozen=PEFT_STAGES) for t in ("attn", "mlp", "all")]
        specs += [lit(t) for t in ("qv", "attn", "mlp")]
        specs += [lit("qv", frozen=("norms",), lora_rank=r, lora_alpha=2 * r) for r in (1, 8)]
        specs += [lit("mlp", frozen=("embedding", "head"), dtype="bf16"), lit("qv", replays=3),
                  lit("attn", warmup_steps=1, replays=2, frozen=PEFT_STAGES),
                  lit("qv", frozen=PEFT_STAGES, freeze_timing="unfreeze_after"),
                  lit("all", blocks=2, frozen_blocks=1, dtype="bf16"), lit("qv", seed=1, frozen=("head",)),
                  lit(None), lit(None, frozen=("head", "norms"), replays=2),
                  lit(None, blocks=2, frozen_blocks=1, dtype="bf16")]
        specs += [lit(t, frozen=PEFT_STAGES) for t in ("k", "qk", "vo")]
    return dedupe(specs)


@st.composite
def model_case_specs(draw, family: str = GENERATED_MODEL) -> CaseSpec:
    """Any valid Llama-family spec: block count, LoRA targets, rank, frozen stages, dtype, replays."""
    blocks = draw(st.integers(1, 2), label="blocks")
    targets = tuple(p for p in PROJECTIONS if draw(st.booleans(), label=f"lora_{p}"))
    rank = draw(st.sampled_from((1, 2, 4, 8)), label="lora_rank")
    embedding, head = draw(st.booleans(), label="embedding"), draw(st.booleans(), label="head")
    stages = [s for s, present in (("embedding", embedding), ("head", head), ("norms", True)) if present]
    frozen = tuple(s for s in stages if draw(st.booleans(), label=f"frozen_{s}"))
    cfg = ModelConfig(blocks=blocks, lora_on=targets, lora_rank=rank, lora_alpha=2 * rank, embedding=embedding,
                      head=head, frozen=frozen, frozen_blocks=draw(st.integers(0, blocks), label="frozen_blocks"))
    return model_spec(family, cfg, not embedding and draw(st.booleans(), label="x_grad"),
                      dtype=draw(st.sampled_from(("fp32", "bf16")), label="dtype"),
                      replays=draw(st.integers(1, 2), label="replays"), seed=draw(st.integers(0, 3), label="seed"))
