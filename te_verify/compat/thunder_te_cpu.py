"""thunder 0.2.6's transformer_engine_ex on the CPU emulation: its linear checker's device test.

thunder's `_linear_checker` claims a linear only when every input is on CUDA. Over TE's Python on the tex
emulation the TE device is the CPU, so the step registers a copy of thunder's own checker whose `devices`
global maps DeviceType.CUDA to CPU; the recipe and shape checks, and every other part of the executor, are
thunder's code unchanged. Guarded to thunder 0.2.6 and to the checker's source still testing DeviceType.CUDA.
"""
from __future__ import annotations

import importlib.metadata
import inspect
import types

from te_verify.compat import record

GUARDED_VERSION = "0.2.6"
STEP = ("thunder-te-cpu-device: thunder 0.2.6's transformer_engine_ex claims linears only on CUDA tensors; its own "
        "_linear_checker, re-bound so DeviceType.CUDA reads as CPU (the emulated TE device), replaces it in the "
        "executor's implmap")


class ThunderTEStepError(RuntimeError):
    """The installed thunder is not the version the step is written for; one line says which."""


def apply(impl: types.ModuleType) -> None:
    """Register the relaxed checker on `impl` (thunder.executors.transformer_engineex_impl); idempotent."""
    version = importlib.metadata.version("lightning-thunder")
    checker = impl._linear_checker
    if "devices.DeviceType.CUDA" not in inspect.getsource(checker):  # what it relaxes must be there (any version)
        raise ThunderTEStepError(f"thunder {version}: its _linear_checker no longer tests DeviceType.CUDA, which the "
                                 f"CPU device step relaxes (written for thunder {GUARDED_VERSION}); thunder_te cannot "
                                 f"run on the emulation with this thunder")
    info = impl.transformer_engine_ex.implmap[impl.linear_prim.id]
    if getattr(info.checker, "__te_verify_step__", False):
        return
    cpu = types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA=impl.devices.DeviceType.CPU))
    relaxed = types.FunctionType(checker.__code__, {**checker.__globals__, "devices": cpu}, checker.__name__,
                                 checker.__defaults__, checker.__closure__)
    relaxed.__te_verify_step__ = True
    info.checker = relaxed
    record(STEP)
