"""The model families' freezing rule, one for all: a parameter trains or not by its stage and its block.

A family names each parameter's stage ("embedding", "head", "norms" as ModelConfig.frozen spells them; "adapter"
for a LoRA matrix; "linear" for any other projection weight; "unused" for a parameter the case's forward never
reads) and its block (None outside the blocks); its `trainable(name, cfg)` is `rule` on them, and `set_frozen`
applies that by qualified name (the distributed lane applies it by the names parameters had before wrapping).
"""
from __future__ import annotations

from typing import Callable

import torch

from te_verify.spec import STAGES, ModelConfig


def rule(stage: str, block: int | None, cfg: ModelConfig) -> bool:
    """Frozen: the first `frozen_blocks` blocks whole, the stages in `frozen`, unused parameters, and with adapters
    (PEFT) every projection's own weight; everything else trains."""
    if block is not None and block < cfg.frozen_blocks:
        return False
    if stage in STAGES:
        return stage not in cfg.frozen
    return stage == "adapter" or (stage == "linear" and not cfg.lora_on)


def set_frozen(model: torch.nn.Module, cfg: ModelConfig, trainable: Callable[[str, ModelConfig], bool]) -> None:
    """requires_grad of every parameter by the family's `trainable(qualified name, cfg)`."""
    for name, p in model.named_parameters():
        p.requires_grad_(trainable(name, cfg))


def block_of(name: str, prefix: str) -> int | None:
    """The block index after `prefix` in a qualified name ("blocks." in "blocks.3.attn.q.weight" gives 3)."""
    at = name.find(prefix)
    if at < 0:
        return None
    return int(name[at + len(prefix):].split(".", 1)[0])
