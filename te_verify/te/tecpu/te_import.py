"""Boot TE's real Python layer on a CPU machine over the tex emulation.

1. The installed `transformer-engine` version must be one the emulation serves (>= MIN_TE_VERSION, with a
   generated surface); otherwise one line says which version and what would work.
2. Every `transformer_engine.*` module is loaded through rewrite.TEFinder (CUDA touch points rewritten, TE's
   triton kernels stubbed strictly).
3. TE's own switch NVTE_PROJECT_BUILDING (common/__init__.py) skips its ctypes loading of the CUDA libraries,
   and `common.load_framework_extension` is replaced, as soon as that module has executed, by one that
   installs the emulated `transformer_engine_torch` instead of loading the .so.
4. `transformer_engine.pytorch` is imported with TE's own switch NVTE_TORCH_COMPILE=0 (JIT_FUSIONS): TE's jit_fuser
   functions (LayerNormMLP's bias+GELU and its gradient) then run as TE wrote them, eagerly, instead of through
   torch.compile, whose inductor build on CPU took 20-45 s per new shape here (measured 2026-11-29 on TE 2.20.2's
   LayerNormMLP, 8x16 -> 32); the four GELU ones with the compiled kernel's numerics (fp32 inside, one rounding:
   jit_fusions.py); the header says so.
5. nvdlfw_inspect's DebugManager, once imported, loads TE's debug features (files it reads by path) through the
   rewriting loader too (nvinspect.py). Nothing else of the process is changed.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import types
from dataclasses import dataclass

from packaging.version import Version

from te_verify.te.tecpu import cuda, device, jit_fusions, nvinspect, real_triton, rewrite, surface, tex

MIN_TE_VERSION = "2.14.0"  # the tex boundary the emulation implements (same signatures from 2.14.0 on)
# The recipes whose quantizers tex emulates (quantize.py, block_quantize.py), for the report header; which of them
# TE accepts is TE's own check against the emulated capability.
# TE's switch for its jit_fuser functions during the import, and the header's words for it.
JIT_FUSIONS = ("NVTE_TORCH_COMPILE", "0")
JIT_NOTE = ("TE's jit fusions run eagerly (NVTE_TORCH_COMPILE=0), its GELU fusions in fp32 with one rounding as "
            "their compiled kernels")
QUANTIZERS = ("quantizers emulated: DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, "
              "NVFP4BlockScaling (MXFP8 and NVFP4 need sm100; NVFP4 stochastic rounding from a seeded generator)")


def describe(te_version: str, capability: str) -> str:
    """The report header's line for TE's Python over the emulation."""
    cublaslt = _dotted(device.cublaslt_version())
    return (f"TE {te_version} Python layer; tex emulated on CPU (C++ kernels not under test); emulated {capability}, "
            f"CUDA {device.CUDA_VERSION} as TE's code reads torch.version.cuda, cuBLASLt {cublaslt} as "
            f"tex.get_cublasLt_version answers; {QUANTIZERS}; {JIT_NOTE}; {real_triton.describe()}")


def _dotted(version: int) -> str:
    """cuBLAS's integer (130300) as major.minor (13.3)."""
    return f"{version // 10000}.{version // 100 % 100}"


class BootError(RuntimeError):
    """TE cannot be served over the emulation here; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class BootInfo:
    """What ran, for the report header."""

    # The transformer-engine version whose Python layer was imported, and where from.
    te_version: str
    te_path: str
    # The emulated compute capability ("sm90").
    capability: str
    # The sdist the tex surface was generated from.
    surface_source: str
    # Rewritten CUDA touch points by rule, and the stubbed triton modules.
    rewrites: dict[str, int]
    stubbed_modules: tuple[str, ...]

    @property
    def header(self) -> str:
        return describe(self.te_version, self.capability)


_BOOTED: list[BootInfo] = []
_LOG = rewrite.RewriteLog()


def installed_te_version() -> str:
    """surface.installed_te_version as the boot reads it: a string, or a BootError saying how to install TE."""
    try:
        return str(surface.installed_te_version())
    except importlib.metadata.PackageNotFoundError:
        raise BootError("transformer-engine is not installed: `pip install --no-deps transformer-engine==2.20.2` "
                        "(scripts/bootstrap.sh does), or run with --te-impl reference") from None


def check_version(te_version: str) -> surface.Surface:
    if Version(te_version) < Version(MIN_TE_VERSION):
        raise BootError(f"TE {te_version} predates the tex boundary the emulation serves (>= {MIN_TE_VERSION}): "
                        f"install transformer-engine>={MIN_TE_VERSION} with --no-deps, or run with --te-impl reference")
    try:
        return surface.load(te_version)
    except surface.SurfaceError as exc:
        raise BootError(str(exc)) from None


def _load_framework_extension(framework: str) -> None:
    """Replaces common.load_framework_extension: the extension is the emulation, already in sys.modules."""
    if framework != "torch":
        raise ImportError(f"te_verify.te.tecpu emulates only TE's PyTorch extension, not {framework}'s")
    module = sys.modules.get(tex.MODULE_NAME)
    if module is None or not (module.__doc__ or "").startswith("te_verify.te.tecpu"):
        raise ImportError("te_verify.te.tecpu: transformer_engine_torch is not the emulation")


def _patch_common(module: types.ModuleType) -> None:
    module.load_framework_extension = _load_framework_extension


@contextlib.contextmanager
def _env(name: str, value: str):
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def boot(capability: str = device.DEFAULT_CAPABILITY) -> BootInfo:
    """Import TE's Python layer over the emulation (once per process; later calls return the same info)."""
    if _BOOTED:
        if _BOOTED[0].capability != capability:
            raise BootError(f"TE was booted as {_BOOTED[0].capability} in this process; cannot switch to {capability}")
        return _BOOTED[0]
    if "transformer_engine.pytorch" in sys.modules or tex.MODULE_NAME in sys.modules:
        raise BootError("transformer_engine.pytorch was imported before te_verify.te.tecpu booted it; boot first")
    te_version = installed_te_version()
    tex_surface = check_version(te_version)
    device.configure(capability)
    device.configure_cublaslt(os.environ.get(device.CUBLASLT_ENV))
    try:
        real_triton.configure(os.environ.get(real_triton.TRITON_ENV))
    except real_triton.TritonModeError as exc:
        raise BootError(str(exc)) from None
    sys.modules[tex.MODULE_NAME] = tex.build(tex_surface)
    rewrite.install(cuda.make_shim(), _LOG, {"transformer_engine.common": _patch_common,
                                             "transformer_engine.pytorch.jit": jit_fusions.patch,
                                             nvinspect.MODULE: nvinspect.patch},
                    stub_triton=real_triton.stubbed())
    if nvinspect.MODULE in sys.modules:
        nvinspect.patch(sys.modules[nvinspect.MODULE])
    try:
        with _env("NVTE_PROJECT_BUILDING", "1"), _env(*JIT_FUSIONS):
            te = importlib.import_module("transformer_engine.pytorch")
    except jit_fusions.MissingFusion as exc:
        raise BootError(str(exc)) from None
    info = BootInfo(te_version, os.path.dirname(os.path.dirname(te.__file__)), capability, tex_surface.source,
                    _LOG.by_rule(), tuple(_LOG.stubbed_modules))
    _BOOTED.append(info)
    return info


def booted() -> BootInfo | None:
    return _BOOTED[0] if _BOOTED else None
