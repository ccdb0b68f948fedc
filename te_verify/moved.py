"""The import paths user code had before the reorganisation into packages (commit 2d5dd5f), in one table, and what
keeps them importable for one more release with a DeprecationWarning naming the import to write now (docs/api.md).

The shims that use it: te_verify/reference.py, te_verify/tecpu.py, te_verify/te_api.py (whole modules that moved),
te_verify/distributed/training.py and the `__getattr__` of te_verify/distributed/wrappers/__init__.py (names that left
a module). A moved object is fetched from its home by name when the old path is used, so this module imports nothing
of te_verify and sits at the base of the layering (tests/test_layout.py), below every shim.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

# The release that removes the old paths (this one, 0.1.x, is the one release they still work in).
REMOVED_IN = "0.2.0"
# The stable surface user code imports from.
PUBLIC = "te_verify.api"

# Whole modules that moved: old path -> new path. The old path becomes an alias of the new module (the same object).
# Only what user code names: a --te-impl module, the CPU boot of TE's Python, the TE build API.
MODULES = {
    "te_verify.reference": "te_verify.te.reference",  # `--te-impl te_verify.reference`
    "te_verify.tecpu": "te_verify.te.tecpu",  # tecpu.boot(): TE's Python over the tex emulation
    "te_verify.te_api": "te_verify.te.api",  # the TE build API (its public part is in te_verify.api)
}


def _names(home: str, use: str, *names: str) -> dict[str, tuple[str, str]]:
    return {name: (home, use) for name in names}


# Names that left a module still importable by its old path: old module -> {name: (home module, module to import
# it from now)}. Where the name is in the public module, that is the one to import from.
NAMES = {
    "te_verify.distributed.wrappers": _names("te_verify.distributed.types", PUBLIC, "Wrapped", "grad_of",
                                             "param_slots", "param_tensors", "units_of", "value_of", "storage_bytes"),
    "te_verify.distributed.training": {
        **_names("te_verify.training", PUBLIC, "TrainStep", "StateBytes", "sgd"),
        **_names("te_verify.training", "te_verify.training", "default_backward", "run_iteration"),
        **_names("te_verify.distributed.rank.training", "te_verify.distributed.rank.training", "microbatches",
                 "eager_trajectory", "load_te", "te_stack"),
    },
}


def _warn(old: str, use: str, stacklevel: int) -> None:
    warnings.warn(f"{old} is deprecated since the reorganisation into packages and goes in te_verify {REMOVED_IN}: "
                  f"{use} (docs/api.md)", DeprecationWarning, stacklevel=stacklevel + 1)


def alias(old: str) -> ModuleType:
    """Called by the shim module `old` as it is imported: `old` becomes the module it moved to, with a warning (once
    per process: later imports find it in sys.modules). Its submodules are not aliased (docs/api.md)."""
    new = MODULES[old]
    module = importlib.import_module(new)
    sys.modules[old] = module
    # Frames: _warn, alias, the shim's body, then (importlib's frames skipped by warnings) the importing line.
    _warn(old, f"import {new} instead", stacklevel=3)
    return module


def module_getattr(old: str) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `old`: a name that left it warns and returns the object from its home;
    any other name is an AttributeError, as without it."""
    moved = NAMES[old]

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        home, use = moved[name]
        # `from package import name` asks twice: the import system's hasattr (_handle_fromlist), then the import
        # itself; only the second warns, so each old import warns once.
        if sys._getframe(1).f_code.co_name != "_handle_fromlist":
            _warn(f"{old}.{name}", f"use `from {use} import {name}`", stacklevel=2)
        return getattr(importlib.import_module(home), name)

    return __getattr__
