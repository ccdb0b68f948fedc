"""Which implementation serves the TE API subset: `--te-impl reference|transformer_engine|package.module`.

`resolve(name)` returns a TEImpl whose `api` namespace has Linear, GroupedLinear, GroupedMLP (None where the
build has no such module), autocast(enabled, recipe=...) (both TE spellings accepted), fp8_autocast,
DelayedScaling, Float8CurrentScaling, Format, is_fp8_available(return_reason=True) and
FREE_SAVED_AFTER_BACKWARD. Default (name None): real TE when `transformer_engine.pytorch` imports, else
the reference, with a one-line why. `activate`/`active` hold the choice for the backends.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

REQUIRED = ("Linear", "DelayedScaling", "Float8CurrentScaling", "is_fp8_available")


class TEImplError(ValueError):
    """An unknown or unusable --te-impl; the message is one line naming it."""


@dataclass(frozen=True)
class TEImpl:
    """The chosen implementation."""

    # "reference", "transformer_engine" or the module path given.
    name: str
    # One line: why this implementation serves the run.
    why: str
    # The API subset (see module docstring).
    api: SimpleNamespace

    @property
    def is_reference_runtime(self) -> bool:
        """True when the reference executor (ours) serves thunder_te, i.e. not real TE."""
        return self.name != "transformer_engine"


def _autocast_of(module: ModuleType):
    """A uniform autocast(enabled=True, recipe=None): TE >= 2.9 `autocast`, else `fp8_autocast(fp8_recipe=)`."""
    if hasattr(module, "autocast"):
        return module.autocast
    if hasattr(module, "fp8_autocast"):
        def autocast(enabled: bool = True, calibrating: bool = False, recipe=None, amax_reduction_group=None):
            return module.fp8_autocast(enabled=enabled, calibrating=calibrating, fp8_recipe=recipe,
                                       fp8_group=amax_reduction_group)
        return autocast
    return None


def _namespace(module: ModuleType, recipes: ModuleType | None = None) -> SimpleNamespace:
    recipes = recipes or module
    return SimpleNamespace(
        module=module,
        Linear=getattr(module, "Linear", None),
        GroupedLinear=getattr(module, "GroupedLinear", None),
        GroupedMLP=getattr(module, "GroupedMLP", None),
        autocast=_autocast_of(module),
        fp8_autocast=getattr(module, "fp8_autocast", None),
        DelayedScaling=getattr(recipes, "DelayedScaling", None),
        Float8CurrentScaling=getattr(recipes, "Float8CurrentScaling", None),
        Format=getattr(recipes, "Format", None),
        is_fp8_available=getattr(module, "is_fp8_available", None),
        FREE_SAVED_AFTER_BACKWARD=getattr(module, "FREE_SAVED_AFTER_BACKWARD", False),
    )


def _check(name: str, api: SimpleNamespace) -> None:
    missing = [attr for attr in REQUIRED if getattr(api, attr) is None] + ([] if api.autocast else ["autocast/fp8_autocast"])
    if missing:
        raise TEImplError(f"--te-impl {name!r}: the module lacks {', '.join(missing)} of the TE API subset")


def _real_te() -> SimpleNamespace:
    te = importlib.import_module("transformer_engine.pytorch")
    recipes = importlib.import_module("transformer_engine.common.recipe")
    api = _namespace(te, recipes)
    api.FREE_SAVED_AFTER_BACKWARD = True  # TE issue 990
    return api


def real_te_reason() -> str | None:
    """None when transformer_engine.pytorch imports, else TE's own import error in one line."""
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # TE raises OSError/RuntimeError too when CUDA libraries are missing
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def resolve(name: str | None) -> TEImpl:
    """The TE implementation for `--te-impl name` (None: real TE if it imports, else the reference)."""
    if name in (None, "", "auto"):
        reason = real_te_reason()
        if reason is None:
            return TEImpl("transformer_engine", "default: transformer_engine.pytorch imports", _real_te())
        return TEImpl("reference", f"default: transformer_engine.pytorch does not import ({reason})",
                      _namespace(importlib.import_module("te_verify.reference")))
    if name == "reference":
        return TEImpl("reference", "--te-impl reference", _namespace(importlib.import_module("te_verify.reference")))
    if name == "transformer_engine":
        reason = real_te_reason()
        if reason is not None:
            raise TEImplError(f"--te-impl transformer_engine: transformer_engine.pytorch does not import ({reason})")
        return TEImpl(name, "--te-impl transformer_engine", _real_te())
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        raise TEImplError(f"--te-impl {name!r}: cannot import it: {type(exc).__name__}: {exc}") from None
    api = _namespace(module)
    _check(name, api)
    return TEImpl(name, f"--te-impl {name}", api)


_ACTIVE: list[TEImpl] = []


def activate(impl: TEImpl) -> None:
    """Make `impl` the one the TE backends use."""
    _ACTIVE[:] = [impl]


def active() -> TEImpl:
    """The activated implementation (resolving the default on first use)."""
    if not _ACTIVE:
        _ACTIVE.append(resolve(None))
    return _ACTIVE[0]


@contextlib.contextmanager
def using(impl: TEImpl):
    """Activate `impl` for a block (tests), restoring the previous choice afterwards."""
    previous = list(_ACTIVE)
    activate(impl)
    try:
        yield impl
    finally:
        _ACTIVE[:] = previous


def make_recipe(api: SimpleNamespace, recipe: str | None, fp8_format: str = "E4M3"):
    """The spec's recipe name ("delayed"/"current"/None) as a recipe object of `api`, in `fp8_format`.

    "E4M3" uses E4M3 for gradients too, held to E4M3 tolerances (rtol 0.125, atol 0.0675: TE quantization_tols,
    thunder te_assert_close); "HYBRID" quantizes gradients to E5M2 (2 mantissa bits), held to rtol 0.25, atol 0.125.
    """
    if recipe is None:
        return None
    fmt = getattr(api.Format, fp8_format)
    if recipe == "delayed":
        return api.DelayedScaling(fp8_format=fmt)
    return api.Float8CurrentScaling(fp8_format=fmt)
