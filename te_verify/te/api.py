"""Which implementation serves the TE families: `--te-impl transformer_engine|transformer_engine_cpu|reference|pkg.mod`.

- `transformer_engine`: the installed TE on a CUDA device (its C++ kernels under test too).
- `transformer_engine_cpu`: the installed TE's Python layer over the tex emulation (te_verify.te.tecpu): TE's
  modules, autograd functions and quantizers are TE's own code; its C++ kernels are emulated, not under test.
- `reference`: te_verify.te.reference, a pure-PyTorch model of TE's intended contract (te_eager only).
- `package.module`: a module exposing the API subset below; one whose Linear is TE's own (a build patching TE's
  Python) is measured as TE's Python is, at the tex boundary.
Default: real TE where CUDA is available and TE imports; TE's Python over the emulation where the wheel is
installed and there is no CUDA; else the reference. Every choice is checked cheaply at start (one line naming
the problem and the choice that would work); TE's import itself happens on first use of `impl.api`.

The `api` namespace: Linear, GroupedLinear, GroupedMLP and ops (None where absent), autocast(enabled,
recipe=...) (both TE spellings), DelayedScaling, Float8CurrentScaling, the block-scaling recipes (MXFP8BlockScaling,
Float8BlockScaling, NVFP4BlockScaling; None where absent), Format, is_fp8_available(return_reason).
A `package.module` needs the REQUIRED names and a Linear taking LINEAR_KEYWORDS (else one line at start); a case
using more of TE's API than the module has (GroupedLinear, te.ops, main_grad, backward_dw, Format) skips naming
it (backends.te_eager.missing_api), and one needing FP8 where is_fp8_available says no skips with its reason.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Callable

import torch

from te_verify import moved

REQUIRED = ("Linear", "DelayedScaling", "Float8CurrentScaling", "is_fp8_available")
# What every TE family builds Linear with (TE's own keywords); main_grad, delayed wgrad and `name` are optional.
LINEAR_KEYWORDS = ("bias", "params_dtype", "device")
REAL, EMULATED, REFERENCE, EXTERNAL = "real", "emulated", "reference", "external"
CPU_CHOICE = "transformer_engine_cpu"


class TEImplError(ValueError):
    """An unknown or unusable --te-impl; the message is one line naming it and what would work."""


@dataclass(frozen=True)
class TEImpl:
    """The chosen implementation; `api` imports it on first use."""

    # The --te-impl value ("transformer_engine", "transformer_engine_cpu", "reference" or a module path).
    name: str
    # REAL, EMULATED, REFERENCE or EXTERNAL.
    kind: str
    # One line: why this implementation serves the run.
    why: str
    # One line for the report header: exactly what ran.
    describe: str
    # Builds the API namespace (imports TE, boots the emulation); called once.
    load: Callable[[], SimpleNamespace] = field(repr=False, compare=False)

    @functools.cached_property
    def api(self) -> SimpleNamespace:
        return self.load()

    @property
    def runs_te_python(self) -> bool:
        """TE's own Python layer serves the modules (real TE, or its Python over the emulation)."""
        return self.kind in (REAL, EMULATED)


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
        LayerNormLinear=getattr(module, "LayerNormLinear", None),
        LayerNormMLP=getattr(module, "LayerNormMLP", None),
        ops=getattr(module, "ops", None),
        autocast=_autocast_of(module),
        DelayedScaling=getattr(recipes, "DelayedScaling", None),
        Float8CurrentScaling=getattr(recipes, "Float8CurrentScaling", None),
        MXFP8BlockScaling=getattr(recipes, "MXFP8BlockScaling", None),
        Float8BlockScaling=getattr(recipes, "Float8BlockScaling", None),
        NVFP4BlockScaling=getattr(recipes, "NVFP4BlockScaling", None),
        CustomRecipe=getattr(recipes, "CustomRecipe", None),
        Format=getattr(recipes, "Format", None),
        is_fp8_available=getattr(module, "is_fp8_available", None),
    )


@functools.lru_cache(maxsize=64)
def accepts(cls: type, keyword: str) -> bool:
    """Whether `cls(...)` takes `keyword` (by name, or through **kwargs); a signature Python cannot read: yes."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check(name: str, api: SimpleNamespace) -> None:
    missing = [attr for attr in REQUIRED if getattr(api, attr) is None] + ([] if api.autocast else ["autocast/fp8_autocast"])
    if missing:
        raise TEImplError(f"--te-impl {name!r}: the module lacks {', '.join(missing)} of the TE API subset")
    untaken = [kw for kw in LINEAR_KEYWORDS if not accepts(api.Linear, kw)]
    if untaken:
        raise TEImplError(f"--te-impl {name!r}: its Linear takes no {', '.join(untaken)} keyword (TE's "
                          f"Linear(in_features, out_features, bias=, params_dtype=, device=))")


def _te_python() -> SimpleNamespace:
    te = importlib.import_module("transformer_engine.pytorch")
    return _namespace(te, importlib.import_module("transformer_engine.common.recipe"))


def te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def real_te_reason() -> str | None:
    """None when real TE can run here (CUDA and an importable transformer_engine.pytorch), else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (TE's kernels need one)"
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # TE raises OSError/RuntimeError too when CUDA libraries are missing
        return f"transformer_engine.pytorch does not import: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def transformer_engine_version() -> str | None:
    """The installed transformer-engine version (read from its metadata, without importing TE)."""
    try:
        return importlib.metadata.version("transformer_engine")
    except importlib.metadata.PackageNotFoundError:
        return None


def _real(why: str) -> TEImpl:
    from te_verify import device as run_device

    gpu = run_device.active() if run_device.active().type == "cuda" else torch.device("cuda", 0)
    return TEImpl("transformer_engine", REAL, why, f"TE {transformer_engine_version()} on "
                  f"{torch.cuda.get_device_name(gpu)} (Python layer and C++ kernels under test)", _te_python)


def _emulated(why: str, capability: str) -> TEImpl:
    from te_verify.te import tecpu
    from te_verify.te.tecpu import device, te_import

    if capability not in device.CAPABILITIES:
        raise TEImplError(f"--te-capability {capability!r}: expected one of {', '.join(device.CAPABILITIES)}")
    try:
        version = te_import.installed_te_version()
        te_import.check_version(version)
    except tecpu.BootError as exc:
        raise TEImplError(f"--te-impl {CPU_CHOICE}: {exc}") from None

    def load() -> SimpleNamespace:
        tecpu.boot(capability)
        return _te_python()

    return TEImpl(CPU_CHOICE, EMULATED, why, te_import.describe(version, capability), load)


def _reference(why: str) -> TEImpl:
    return TEImpl("reference", REFERENCE, why, "te_verify.te.reference: a pure-PyTorch model of TE's contract (not TE)",
                  lambda: _namespace(importlib.import_module("te_verify.te.reference")))


def _quantized_reference_api() -> SimpleNamespace:
    """The reference's API with its block-scaled recipes (te.reference.block_recipe): the same-quantization reference
    of TE's runs models them; as a --te-impl the reference offers per-tensor scaling only (its saved copies and waste
    are modelled per tensor), so block-scaled cases skip there."""
    from te_verify.te.reference import block_recipe

    api = _namespace(importlib.import_module("te_verify.te.reference"))
    for name, cls in block_recipe.RECIPE_CLASSES.items():
        setattr(api, name, cls)
    api.custom_factory = lambda name: name  # the reference's CustomRecipe takes the zoo factory's name
    return api


@functools.lru_cache(maxsize=1)
def quantized_reference() -> TEImpl:
    """te.reference as the same-quantization reference of FP8 and block-scaled cases (te_case.output_reference)."""
    return TEImpl("reference", REFERENCE, "the same-quantization reference",
                  "te_verify.te.reference with its block-scaled recipes", _quantized_reference_api)


def _external(name: str) -> TEImpl:
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        raise TEImplError(f"--te-impl {name!r}: cannot import it: {type(exc).__name__}: {exc}") from None
    api = _namespace(module)
    _check(name, api)
    # An old path kept for one release (te_verify.moved) says so in the header: its warning is a developer's.
    note = f"; a deprecated path, use --te-impl {moved.MODULES[name]}" if name in moved.MODULES else ""
    if _is_te_python(api.Linear):  # a build over TE's own Python: measured at the tex boundary like TE itself
        from te_verify.te import tecpu

        kind, over = (EMULATED, "TE's Python over the tex emulation") if tecpu.booted() else (REAL, "TE's Python")
        return TEImpl(name, kind, f"--te-impl {name}", f"{name} (a user-supplied TE API module over {over}{note})",
                      lambda: api)
    return TEImpl(name, EXTERNAL, f"--te-impl {name}", f"{name} (a user-supplied TE API module{note})", lambda: api)


def _is_te_python(linear: type) -> bool:
    """Whether a module's Linear is TE's own (or a subclass of it), so TE's Python layer serves it."""
    return isinstance(linear, type) and any(c.__module__.startswith("transformer_engine.pytorch")
                                            for c in linear.__mro__)


def _default(capability: str) -> TEImpl:
    """Real TE on a CUDA device; TE's Python over the emulation on a machine without CUDA; else the reference."""
    from te_verify import device as run_device

    if run_device.active().type == "cuda":
        reason = real_te_reason()
        return _real("default: CUDA and transformer_engine.pytorch are available") if reason is None \
            else _reference(f"default: no TE to run on CUDA ({reason})")
    if te_installed() and not torch.cuda.is_available():
        return _emulated("default: no CUDA device; the installed TE's Python runs over the tex emulation", capability)
    if te_installed():
        return _reference("default for --device cpu on a CUDA machine: TE's kernels need the GPU and the tex "
                          "emulation serves machines without CUDA")
    return _reference("default: transformer_engine is not installed")


def device_reason(impl: TEImpl, device: torch.device) -> str | None:
    """Why `impl` cannot serve the TE families on `device` (None if it can): real TE needs CUDA, the tex
    emulation runs TE's Python on the CPU only."""
    if impl.kind == REAL and device.type != "cuda":
        return f"--te-impl {impl.name} runs TE's kernels on CUDA, not on --device {device}"
    if impl.kind == EMULATED and device.type != "cpu":
        return (f"--te-impl {impl.name} emulates TE's C++ on the CPU only, not on --device {device}; "
                f"use --te-impl transformer_engine or reference there")
    return None


def resolve(name: str | None, capability: str = "sm90") -> TEImpl:
    """The TE implementation for `--te-impl name` (None: the default for this machine and --device)."""
    if name in (None, "", "auto"):
        return _default(capability)
    if name == "transformer_engine":
        reason = real_te_reason()
        if reason is not None:
            raise TEImplError(f"--te-impl transformer_engine: {reason}; --te-impl {CPU_CHOICE} runs TE's Python "
                              f"layer over the tex emulation, --te-impl reference the pure-PyTorch model")
        return _real("--te-impl transformer_engine")
    if name == CPU_CHOICE:
        return _emulated(f"--te-impl {CPU_CHOICE}", capability)
    if name == "reference":
        return _reference("--te-impl reference")
    return _external(name)


_ACTIVE: list[TEImpl] = []
_CAPABILITY: list[str] = ["sm90"]


def activate(impl: TEImpl, capability: str = "sm90") -> None:
    """Make `impl` the one the TE backends use (and `capability` the one any later emulation boot uses)."""
    _ACTIVE[:] = [impl]
    _CAPABILITY[0] = capability


def capability() -> str:
    """The compute capability TE runs at: the GPU's ("sm90" on an H100), else the emulated one (--te-capability)."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm{major}{minor}"
    return _CAPABILITY[0]


def active() -> TEImpl:
    """The activated implementation (resolving the default on first use)."""
    if not _ACTIVE:
        _ACTIVE.append(resolve(None, _CAPABILITY[0]))
    return _ACTIVE[0]


@contextlib.contextmanager
def using(impl: TEImpl):
    """Activate `impl` for a block (tests), restoring the previous choice afterwards."""
    previous = list(_ACTIVE)
    _ACTIVE[:] = [impl]
    try:
        yield impl
    finally:
        _ACTIVE[:] = previous


def is_api_linear(module: torch.nn.Module) -> bool:
    """Whether `module` is the active --te-impl's Linear once its API is loaded: how the probes know a pure-PyTorch
    build's (a user's module, the reference) TE Linears as linear sites, as they know TE's own by its package."""
    api = _ACTIVE[0].__dict__.get("api") if _ACTIVE else None  # never loads an implementation to answer
    linear = getattr(api, "Linear", None)
    return isinstance(linear, type) and isinstance(module, linear)


def ensure_te_importable() -> None:
    """thunder imports TE whenever its package is installed; without CUDA that import works only over the
    emulation, so boot it first (whatever --te-impl serves the TE families)."""
    from te_verify.te import tecpu

    if te_installed() and not torch.cuda.is_available() and tecpu.booted() is None:
        tecpu.boot(_CAPABILITY[0])


# The spec's block-scaling recipe names -> the TE recipe class (api attribute) each builds.
BLOCK_RECIPES = {"mxfp8": "MXFP8BlockScaling", "block": "Float8BlockScaling", "nvfp4": "NVFP4BlockScaling",
                 "nvfp4_rn": "NVFP4BlockScaling", "custom": "CustomRecipe"}
# Every FP8 recipe name of the spec -> the TE recipe class it builds.
RECIPE_CLASSES = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling", **BLOCK_RECIPES}
# The spec's recipe names -> TE's availability check of the format its GEMMs need (transformer_engine.pytorch); a
# CustomRecipe by the formats of its factory (spec.CUSTOM_FACTORIES).
FORMAT_CHECKS = {"mxfp8": "is_mxfp8_available", "block": "is_fp8_block_scaling_available",
                 "nvfp4": "is_nvfp4_available", "nvfp4_rn": "is_nvfp4_available",
                 "high_precision_fwd_mxfp8_bwd_factory": "is_mxfp8_available"}


def recipe_reason(api: SimpleNamespace, recipe: str | None, qfactory: str = "") -> str | None:
    """Why `api` cannot run the spec's block-scaled `recipe` here (None if it can): a recipe class it lacks, or TE's
    own availability check of the format's GEMMs (the emulated capability on CPU)."""
    if recipe not in BLOCK_RECIPES:
        return None
    cls = BLOCK_RECIPES[recipe]
    if getattr(api, cls, None) is None:
        return f"this TE implementation has no {cls}"
    check = getattr(getattr(api, "module", None), FORMAT_CHECKS.get(qfactory or recipe, ""), None)
    if check is None:
        return None
    ok, reason = check(return_reason=True)
    return None if ok else f"{cls}{f'({qfactory})' if qfactory else ''}: {reason}"


def custom_factory(api: SimpleNamespace, name: str):
    """The CustomRecipe factory `name` of TE's quantizer_factory_zoo (the reference: its own model of it)."""
    if hasattr(api, "custom_factory"):
        return api.custom_factory(name)
    zoo = importlib.import_module("transformer_engine.pytorch.custom_recipes.quantizer_factory_zoo")
    return getattr(zoo, name)


def case_recipe(api: SimpleNamespace, te) -> object | None:
    """The recipe object of a case's TEConfig `te` (every backend builds its recipe here, so none drops a field)."""
    return make_recipe(api, te.recipe, te.fp8_format, te.amax_history_len, te.qfactory)


def make_recipe(api: SimpleNamespace, recipe: str | None, fp8_format: str = "E4M3", amax_history_len: int = 1024,
                qfactory: str = ""):
    """The spec's recipe name (spec.RECIPES) as a recipe object of `api`, in `fp8_format` (NVFP4BlockScaling takes
    none: E2M1 elements, E4M3 scales; "nvfp4" is TE's default, gradients rounded stochastically, "nvfp4_rn"
    NVFP4BlockScaling without stochastic rounding; "custom" is CustomRecipe over the zoo factory `qfactory`).

    "E4M3" uses E4M3 for gradients too, held to E4M3 tolerances (rtol 0.125, atol 0.0675: TE quantization_tols,
    thunder te_assert_close); "HYBRID" quantizes gradients to E5M2 (2 mantissa bits), held to rtol 0.25, atol 0.125.
    """
    if recipe is None:
        return None
    if recipe in BLOCK_RECIPES:
        cls = getattr(api, BLOCK_RECIPES[recipe], None)
        if cls is None:
            raise TEImplError(f"recipe {recipe!r}: this TE implementation has no {BLOCK_RECIPES[recipe]}")
        if recipe == "custom":
            return cls(qfactory=custom_factory(api, qfactory))
        if recipe.startswith("nvfp4"):
            return cls(disable_stochastic_rounding=True) if recipe == "nvfp4_rn" else cls()
        return cls(fp8_format=getattr(api.Format, fp8_format))
    fmt = getattr(api.Format, fp8_format)
    if recipe == "delayed":
        # The history length only where the case sets one: a build's DelayedScaling need not take the keyword.
        return api.DelayedScaling(fp8_format=fmt, **({"amax_history_len": amax_history_len}
                                                     if amax_history_len != 1024 else {}))
    return api.Float8CurrentScaling(fp8_format=fmt)
