"""TE's triton kernels run for real, in triton's interpreter, instead of stubbed (opt-in, for TE's own tests).

By default TE's `transformer_engine.*.triton` modules are stubs (rewrite.StubLoader): a few wrappers in PyTorch
(triton_kernels.py), every other kernel refused. triton has no CPU backend, but its interpreter
(`TRITON_INTERPRET=1`) runs a `@triton.jit` kernel's Python body over CPU tensors, block by block, with numpy: TE's
own kernels (cross entropy, the permutation mask map, mHC, ...) are then what runs, not an emulation of them. Slow
(one Python step per program instance), so it serves `scripts/te_own_tests.py --triton-site`, not the family cases.

triton's autotuner times each config with the active GPU driver's benchmarker; with no GPU there is no driver
("0 active drivers"), so this mode makes a CPU one active that serves only that: every config is reported equally
fast without running it, and the autotuner takes its first (TE's tests check the numerics of whichever config runs;
on a GPU the fastest runs). Any other use of the driver raises, naming it. A machine with an active driver keeps it.

Chosen at boot from TRITON_ENV: unset or "stub" (the default), or "interpret", which needs TRITON_INTERPRET=1 set
before triton is imported and triton importable from a folder outside .venv (the runner puts one on PYTHONPATH:
triton is a GPU-stack wheel of ~300 MB, not the project's dependency). Anything else, or a missing piece, is a
one-line error. The header says which ran.
"""
from __future__ import annotations

import importlib
import os

from te_verify.te.tecpu import triton_interpreter_compat

TRITON_ENV = "TE_VERIFY_TE_TRITON"
MODES = ("stub", "interpret")
_MODE: list[str] = ["stub"]
_VERSION: list[str] = [""]
_COMPAT: list[str] = []  # the interpreter's compatibility steps applied (triton_interpreter_compat.py)


class TritonModeError(ValueError):
    """The requested triton mode cannot be served; the message names the variable and the fix."""


def configure(text: str | None) -> None:
    """The triton mode from TRITON_ENV's value; "interpret" is checked here, at boot, not at the first kernel."""
    mode = text or "stub"
    if mode not in MODES:
        raise TritonModeError(f"{TRITON_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "interpret":
        _VERSION[0] = _prepare_interpreter()
    _MODE[0] = mode


def _prepare_interpreter() -> str:
    """Checks the interpreter can run, makes the CPU driver active and applies its compatibility steps; triton's
    version."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise TritonModeError(f"{TRITON_ENV}=interpret needs TRITON_INTERPRET=1 (triton has no CPU backend; its "
                              "interpreter runs the kernels on CPU tensors)")
    try:
        triton = importlib.import_module("triton")
    except ImportError as exc:
        raise TritonModeError(f"{TRITON_ENV}=interpret: triton is not importable ({exc}); install it into a folder "
                              "of its own (pip install --no-deps --target DIR triton) and put DIR on PYTHONPATH") \
            from None
    _activate_cpu_driver()
    _COMPAT[:] = [note for note in [triton_interpreter_compat.apply(str(triton.__version__))] if note]
    return str(triton.__version__)


# The emulated GPU's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin, as triton's
# get_device_properties reports it): 227 KiB on H100 (sm90) and B200 (sm100). TE's mHC config pruner reads it.
MAX_SHARED_MEM = 232448


class CpuDriver:
    """triton's active driver where none is: the autotuner's benchmarker, device 0 and its shared memory size (what
    TE's config pruners read); anything else raises (strict)."""

    def __init__(self) -> None:
        self.utils = _CpuDriverUtils()

    def get_benchmarker(self):
        return untimed_benchmark

    def get_current_device(self) -> int:
        return 0

    def __getattr__(self, name: str):
        raise RuntimeError(f"te_verify real_triton: triton's CPU driver serves only the autotuner's benchmarker and "
                           f"the device's shared memory, not {name!r} (no GPU here)")


class _CpuDriverUtils:
    def get_device_properties(self, device: int) -> dict[str, int]:
        if device != 0:
            raise RuntimeError(f"te_verify real_triton: one emulated device (0), not {device}")
        return _Properties(max_shared_mem=MAX_SHARED_MEM)

    def __getattr__(self, name: str):
        raise RuntimeError(f"te_verify real_triton: triton's CPU driver utils serve only get_device_properties, "
                           f"not {name!r}")


class _Properties(dict):
    """The properties emulated; a read of another raises naming it."""

    def __missing__(self, key: str):
        raise KeyError(f"te_verify real_triton: device property {key!r} is not emulated (only {', '.join(self)})")


def untimed_benchmark(kernel_call, quantiles=None, **_: object) -> list[float] | float:
    """Every config equally fast, unrun: the autotuner keeps its first, and no kernel runs twice into a buffer."""
    return [0.0] * len(quantiles) if quantiles else 0.0


def _activate_cpu_driver() -> None:
    backends = importlib.import_module("triton.backends").backends
    if not any(backend.driver.is_active() for backend in backends.values()):
        importlib.import_module("triton.runtime.driver").driver.set_active(CpuDriver())


def stubbed() -> bool:
    """Whether TE's triton modules are served as stubs (the default)."""
    return _MODE[0] == "stub"


def describe() -> str:
    """The report header's words for TE's triton kernels."""
    if stubbed():
        return "TE's triton kernels stubbed (a few wrappers in PyTorch, the rest refused)"
    compat = "".join(f"; {note}" for note in _COMPAT)
    return (f"TE's triton kernels real, in triton {_VERSION[0]}'s interpreter (TRITON_INTERPRET=1; autotuned kernels "
            f"take their first config{compat})")
