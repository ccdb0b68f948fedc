"""Importing thunder here: every compatibility step it needs, in order, in one place.

1. thunder_named_tensors: torch 2.13 removed five methods thunder 0.2.6 references at import.
2. TE before thunder: thunder imports TE whenever the package is installed; without CUDA that only works
   once TE's Python is booted over the tex emulation (te_api.ensure_te_importable).
3. thunder_te_cpu: over the emulation, thunder's TE executor must see the CPU as its device.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

from te_verify.compat import thunder_named_tensors, thunder_te_cpu

TE_EXECUTOR_IMPL = "thunder.executors.transformer_engineex_impl"
# The first import failure's message: a failed import leaves thunder half-registered in sys.modules, and trying again
# fails for that instead ("ProxyTag.STATIC_MEMORY_LOCATION is already registered"), hiding the cause.
_FAILURE: list[str] = []


def import_thunder() -> ModuleType:
    """thunder, importable and with its TE executor usable on the emulated device; ImportError with the cause."""
    from te_verify.te import api as te_api
    from te_verify.te import tecpu

    if _FAILURE:
        raise ImportError(_FAILURE[0])
    thunder_named_tensors.apply()
    try:
        te_api.ensure_te_importable()
        thunder = importlib.import_module("thunder")
        impl = sys.modules.get(TE_EXECUTOR_IMPL)
        if impl is not None and tecpu.booted() is not None:
            thunder_te_cpu.apply(impl)
    except Exception as exc:  # thunder import errors surface as AttributeError/RuntimeError too
        _FAILURE.append(f"thunder failed to import: {type(exc).__name__}: {exc}")
        raise ImportError(_FAILURE[0]) from exc
    return thunder
