"""thunder.jit with its default executors (torch executor on CPU)."""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec


class ThunderBackend:
    name = "thunder"

    def available(self) -> tuple[bool, str]:
        try:
            from te_verify.compat.thunder_named_tensors import import_thunder

            import_thunder()
        except ImportError as exc:
            return False, str(exc)
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        from te_verify.compat.thunder_named_tensors import import_thunder

        return import_thunder().jit(model)


def compilations(fn) -> int | None:
    """How many times thunder compiled `fn` (its cache misses), or None if `fn` is not a thunder function."""
    try:
        from te_verify.compat.thunder_named_tensors import import_thunder

        return int(import_thunder().cache_misses(fn))
    except Exception:  # not a thunder-jitted callable
        return None
