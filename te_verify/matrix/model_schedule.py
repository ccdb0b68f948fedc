"""Case generators for freeze schedules on the model families (family model_schedule, CaseSpec.schedule over
spec.model), on the torch lane.

The trainable set of transformers' Llama under peft's LoRA (hf_peft), LitGPT's litgpt.lora.GPT (litgpt_lora) and our
own Llama blocks (llama) changes between iterations as users change it (models.stages.changed): LoRA's phase switch
(adapters frozen, the base projections and frozen stages trained), unfreezing everything after LoRA warm-up, then
freezing the adapters (full fine-tuning of the base), a frozen backbone under a trained head, and a switch there and
back. Every iteration trains something: a step with nothing to train raises in eager too and would end the run before
the change. Sizes are the families' own cases' (matrix.models: one block, n_embd 32, a (2, 8) batch).
"""
from __future__ import annotations

from te_verify.matrix.models import LORA_TARGETS, PEFT_STAGES, model_spec, real_model_spec
from te_verify.matrix.tiers import check_tier, dedupe
from te_verify.spec import CaseSpec, ModelConfig

FAMILY = "model_schedule"
# The schedules: LoRA's phase switch; unfreeze after LoRA warm-up, then the adapters frozen; the head alone after
# iteration 1; a switch before 2 and back before 3.
PLANS = {"phase": ((2, "swap"),), "unfreeze": ((2, "unfreeze_all"), (3, "freeze_adapters")),
         "head": ((2, "freeze_all_but_last"),), "switch_back": ((2, "swap"), (3, "swap"))}


def schedule_case(kind: str, plan: str, lora: str = "qv", **changes) -> CaseSpec:
    """A `kind` model (token ids in, logits out; adapters on LORA_TARGETS[lora], PEFT's frozen stages unless
    `frozen` says otherwise) under PLANS[plan]; other keywords as matrix.models.real_model_spec takes them."""
    changes.setdefault("frozen", PEFT_STAGES)
    return real_model_spec(kind, lora, schedule=PLANS[plan], **changes).replace(family=FAMILY)


def llama_case(plan: str, x_grad: bool, **fields) -> CaseSpec:
    """Our own Llama block with LoRA on q and v (hidden states in and out, norms trained) under PLANS[plan]."""
    cfg = ModelConfig(lora_on=LORA_TARGETS["qv"], **fields)
    return model_spec(FAMILY, cfg, x_grad, schedule=PLANS[plan])


def model_schedule_specs(tier: str) -> list[CaseSpec]:
    """smoke: hf_peft's phase switch; pr: that and litgpt_lora's unfreeze then frozen adapters (drawn pairwise);
    nightly: every plan on both libraries' models, hidden states in (hf_peft headless, an input needing grad), two
    blocks with the first frozen, bf16, freezing after prepare, and our Llama block's plans."""
    check_tier(tier)
    specs = [schedule_case("hf_peft", "phase"), schedule_case("litgpt_lora", "unfreeze")]
    if tier == "smoke":
        return specs[:1]
    if tier == "nightly":
        specs += [schedule_case(kind, plan) for kind in ("hf_peft", "litgpt_lora") for plan in PLANS]
        specs += [schedule_case("hf_peft", plan, x_grad=True, tokens=False, frozen=("norms",))
                  for plan in ("phase", "unfreeze")]
        specs += [schedule_case(kind, "unfreeze", "attn", blocks=2, frozen_blocks=1)
                  for kind in ("hf_peft", "litgpt_lora")]
        specs += [schedule_case(kind, "phase", dtype="bf16", freeze_timing="after")
                  for kind in ("hf_peft", "litgpt_lora")]
        specs += [llama_case(plan, x) for plan, x in (("phase", True), ("unfreeze", False), ("switch_back", True))]
    return dedupe(specs)
