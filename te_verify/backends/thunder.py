"""thunder.jit with its default executors (torch executor on CPU)."""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec


class ThunderBackend:
    name = "thunder"

    def available(self) -> tuple[bool, str]:
        try:
            from te_verify.compat.thunder import import_thunder

            import_thunder()
        except ImportError as exc:
            return False, str(exc)
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        from te_verify.compat.thunder import import_thunder

        return import_thunder().jit(model)

