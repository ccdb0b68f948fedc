"""Marks a model family sets on its modules for the oracle: a bare matrix Parameter its model multiplies by hand is
a linear site (LitGPT's LoRA lora_A and lora_B: `x @ A.T @ B.T`, not a Linear)."""
from __future__ import annotations

import torch

# Attribute of a module naming its matrix Parameters that are linear sites. On the module, not the Parameter: a
# sharding wrapper (FSDP2's fully_shard) replaces a module's Parameters with new objects, which would drop a mark on
# them, and the probes' layer numbering would then miss the site.
SITE_MARK = "te_verify_sites"


def mark_site(module: torch.nn.Module, name: str) -> None:
    """Declare `module`'s Parameter `name` a linear site (LitGPT's lora_A, lora_B: `x @ A.T @ B.T`, not a Linear)."""
    setattr(module, SITE_MARK, frozenset(getattr(module, SITE_MARK, frozenset())) | {name})
