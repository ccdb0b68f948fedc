"""Eager PyTorch: the reference every other backend is compared with."""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec


class EagerBackend:
    name = "eager"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return model
