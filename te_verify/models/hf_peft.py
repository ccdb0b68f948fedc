"""The hf_peft family: Hugging Face transformers' Llama, built from a tiny LlamaConfig (nothing downloaded), under
peft's LoRA (`get_peft_model` + `LoraConfig` on the projections `model.lora_on` names), as PEFT users train it.

ModelConfig maps onto transformers' names: q/k/v/o -> q_proj/k_proj/v_proj/o_proj, fc_1/fc_2/proj ->
gate_proj/up_proj/down_proj; `blocks` -> num_hidden_layers; `embedding` False feeds hidden states through
`inputs_embeds`; `head` False builds the headless LlamaModel (its final norm is then a block-level norm stage);
`frozen_blocks` k is PEFT's `layers_to_transform` (no adapters in the first k layers) plus those layers frozen
whole. Without adapters the model is transformers' own (full fine-tuning with frozen stages). peft's adapters are
torch.nn.Linear modules ("...q_proj.lora_A.default"), so every site is a Linear the oracle and the probes name.
torch.fx cannot trace transformers' Llama (data-dependent masking), so the oracle reads its torch.export graph.

Every backend runs the model with transformers' output-capture variable replaced (compat.
transformers_output_capture): thunder cannot trace the original.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from te_verify.compat import transformers_output_capture
from te_verify.models import stages
from te_verify.models.seeded import CPU, TORCH_DTYPES, family_inputs, seeded_model
from te_verify.spec import CaseSpec, ModelConfig

TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "fc_1": "gate_proj", "fc_2": "up_proj",
           "proj": "down_proj"}


def _import_hf() -> tuple[ModuleType, ModuleType]:
    """transformers and peft, importable: peft imports TE whenever its package is installed, which without CUDA
    works only over the tex emulation (as for thunder)."""
    from te_verify.te import api as te_api

    te_api.ensure_te_importable()
    import peft
    import transformers

    transformers_output_capture.apply()
    return transformers, peft


class HFModel(torch.nn.Module):
    """Tensor in, tensor out around a transformers model: logits with a head, else the last hidden state."""

    def __init__(self, hf: torch.nn.Module, token_ids: bool, head: bool) -> None:
        super().__init__()
        self.hf = hf
        self.token_ids, self.head = token_ids, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": x} if self.token_ids else {"inputs_embeds": x}
        out = self.hf(**inputs, use_cache=False)
        return out.logits if self.head else out.last_hidden_state


def llama_config(transformers: ModuleType, cfg: ModelConfig) -> Any:
    """transformers.LlamaConfig for the case's ModelConfig (multi-head attention, untied head, SDPA)."""
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.n_embd, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.blocks, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
        max_position_embeddings=64, tie_word_embeddings=False, attn_implementation="sdpa")


def build(spec: CaseSpec, device: torch.device) -> HFModel:
    """The seeded model (drawn on the CPU, then moved), every parameter trainable."""
    transformers, peft = _import_hf()
    cfg = spec.model
    # On the CPU whatever the default device; the libraries' own init draws from the global generator: restored.
    with torch.random.fork_rng(devices=[]), CPU:
        hf = (transformers.LlamaForCausalLM if cfg.head else transformers.LlamaModel)(llama_config(transformers, cfg))
        if cfg.lora_on:
            layers = list(range(cfg.frozen_blocks, cfg.blocks)) if cfg.frozen_blocks else None
            lora = peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                                   target_modules=[TARGETS[t] for t in cfg.lora_on], layers_to_transform=layers,
                                   layers_pattern="layers" if layers else None,
                                   task_type="CAUSAL_LM" if cfg.head else "FEATURE_EXTRACTION")
            hf = peft.get_peft_model(hf, lora)
    model = HFModel(hf, cfg.embedding, cfg.head)
    seeded_model(model, torch.Generator(device=CPU).manual_seed(spec.seed))
    model.to(device=device, dtype=TORCH_DTYPES[spec.dtype])
    for p in model.parameters():
        p.requires_grad_(True)  # built trainable like every family; the case's freezing comes after
    return model


make_inputs = family_inputs  # token ids or hidden states, and the output cotangent


def stage_of(name: str, cfg: ModelConfig) -> tuple[str, int | None]:
    """A parameter's stage and block (te_verify.models.stages) from its transformers/peft qualified name."""
    block = stages.block_of(name, ".layers.")
    if ".embed_tokens." in name:
        return ("embedding" if cfg.embedding else "unused"), None  # hidden-state inputs never reach it
    if ".lm_head." in name:
        return "head", None
    if block is None and name.endswith("norm.weight"):  # the final norm: the head's, or the headless model's last
        return ("head" if cfg.head else "norms"), None
    if name.endswith("layernorm.weight"):
        return "norms", block
    return ("adapter" if ".lora_A." in name or ".lora_B." in name else "linear"), block


def trainable(name: str, cfg: ModelConfig) -> bool:
    """The family's freezing rule for one parameter (qualified name)."""
    return stages.rule(*stage_of(name, cfg), cfg)


def set_frozen(model: torch.nn.Module, cfg: ModelConfig) -> None:
    stages.set_frozen(model, cfg, trainable)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers in order (what a sharded wrapper wraps one by one), wherever peft nests them."""
    return next(list(m) for name, m in model.named_modules()
                if name.endswith("layers") and isinstance(m, torch.nn.ModuleList))
