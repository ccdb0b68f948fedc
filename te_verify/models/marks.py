"""Marks a model family sets on its modules for the oracle: a bare matrix Parameter its model multiplies by hand is
a linear site (LitGPT's LoRA lora_A and lora_B: `x @ A.T @ B.T`, not a Linear)."""
from __future__ import annotations

import torch

SITE_MARK = "te_verify_site"  # attribute a family sets on a matrix Parameter its model multiplies by hand


def mark_site(param: torch.nn.Parameter) -> None:
    """Declare a bare matrix Parameter a linear site (LitGPT's lora_A, lora_B: `x @ A.T @ B.T`, not a Linear)."""
    setattr(param, SITE_MARK, True)
