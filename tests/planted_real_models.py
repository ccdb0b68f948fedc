"""A planted fault on the library-model families: eager, with every LoRA base's frozen weight gradient computed in
backward and thrown away (the waste a PEFT integration that forgets `requires_grad` would spend)."""
from __future__ import annotations

import torch

from planted_lora import _Base


def lora_bases(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The Linear each LoRA layer wraps: peft's `base_layer`, LitGPT's `linear` (their parents hold `lora_A`)."""
    return [child for module in model.modules() if hasattr(module, "lora_A")
            for child in module.children() if isinstance(child, torch.nn.Linear)]


class DiscardedBaseWgrad:
    """Eager, except that every LoRA base computes its frozen weight's wgrad GEMM and drops it."""

    name = "planted_discarded_base_wgrad"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec):
        for base in lora_bases(model):
            base.forward = lambda x, base=base: _Base.apply(x, base.weight, "discarded_wgrad")
        return model
