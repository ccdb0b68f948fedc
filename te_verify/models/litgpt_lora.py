"""The litgpt_lora family: LitGPT's own `litgpt.lora.GPT` from a tiny `litgpt.lora.Config` (Llama-style: RMSNorm,
rotary embedding, LLaMAMLP, no biases), as `litgpt finetune_lora` trains it.

ModelConfig maps onto LitGPT's flags: q/k/v -> lora_query/lora_key/lora_value on the fused `attn.qkv`, o ->
lora_projection, fc_1+fc_2+proj -> lora_mlp (one flag: all three or none, spec.KindRules). The model always embeds
token ids and ends in its LM head. LitGPT's adapters are parameters, not modules: a LoRALinear computes
`x @ lora_A.T @ lora_B.T`, and the fused qkv's LoRAQKVLinear `F.linear(x, lora_A)` then `lora_B` as a grouped
conv1d (kernel size 1), so these sites are named by the parameter ("transformer.h.0.attn.qkv.lora_B") and the
probes count that convolution as the GEMMs it is. torch.fx cannot trace the model (Python reads of shapes), so the
oracle reads its torch.export graph.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.models.marks import mark_site
from te_verify.models import stages
from te_verify.models.seeded import CPU, TORCH_DTYPES, family_inputs, seeded_model
from te_verify.spec import CaseSpec, ModelConfig


def config(cfg: ModelConfig) -> Any:
    """litgpt.lora.Config for the case's ModelConfig (Llama-style, multi-head attention, no LoRA on the head)."""
    import litgpt.lora

    lora = set(cfg.lora_on)
    return litgpt.lora.Config(
        name="te_verify-tiny-llama", block_size=64, vocab_size=cfg.vocab, padded_vocab_size=cfg.vocab,
        n_layer=cfg.blocks, n_head=cfg.n_head, n_embd=cfg.n_embd, n_query_groups=cfg.n_head,
        rotary_percentage=1.0, parallel_residual=False, bias=False, norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP", intermediate_size=cfg.intermediate, lora_r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha, lora_dropout=0.0, lora_query="q" in lora, lora_key="k" in lora,
        lora_value="v" in lora, lora_projection="o" in lora, lora_mlp="proj" in lora, lora_head=False)


def build(spec: CaseSpec, device: torch.device) -> torch.nn.Module:
    """The seeded model (drawn on the CPU, then moved), every parameter trainable."""
    import litgpt.lora

    # On the CPU whatever the default device; LitGPT's own init draws from the global generator: restored.
    with torch.random.fork_rng(devices=[]), CPU:
        model = litgpt.lora.GPT(config(spec.model))
    seeded_model(model, torch.Generator(device=CPU).manual_seed(spec.seed))
    model.to(device=device, dtype=TORCH_DTYPES[spec.dtype])
    for module in model.modules():
        if isinstance(module, litgpt.lora.LoRAQKVLinear):
            module.lora_ind  # registers its index buffer now, not in the first forward: the state is read before it
    for name, p in model.named_parameters():
        p.requires_grad_(True)  # built trainable like every family; the case's freezing comes after
        if name.endswith((".lora_A", ".lora_B")):
            owner, attr = name.rsplit(".", 1)
            mark_site(model.get_submodule(owner), attr)  # multiplied by hand (matmul, conv1d): a site without a Linear
    return model


make_inputs = family_inputs  # token ids, and the logits' cotangent


def stage_of(name: str) -> tuple[str, int | None]:
    """A parameter's stage and block (te_verify.models.stages) from its LitGPT qualified name."""
    if name.startswith("transformer.wte."):
        return "embedding", None
    if name.startswith(("lm_head.", "transformer.ln_f.")):
        return "head", None
    block = stages.block_of(name, "transformer.h.")
    if ".norm_" in name:
        return "norms", block
    return ("adapter" if name.endswith((".lora_A", ".lora_B")) else "linear"), block


def trainable(name: str, cfg: ModelConfig) -> bool:
    """The family's freezing rule for one parameter (qualified name)."""
    return stages.rule(*stage_of(name), cfg)


def set_frozen(model: torch.nn.Module, cfg: ModelConfig) -> None:
    stages.set_frozen(model, cfg, trainable)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks in order (what a sharded wrapper wraps one by one)."""
    return list(model.transformer.h)
