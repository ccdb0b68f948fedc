"""The emulated device's settings, shared by the fake torch.cuda and the tex functions.

One process-wide compute capability, stated at boot (sm90 by default) and recorded in the report header:
it decides, exactly as TE's C++ does, whether FP8 GEMMs accept non-TN layouts (sm100: yes, and no transposed
copies are made; sm90: no, so columnwise usage means an explicit transposed copy).
"""
from __future__ import annotations

from typing import Any

import torch

CAPABILITIES = {"sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0)}
DEFAULT_CAPABILITY = "sm90"
TORCH_DTYPES = {"kByte": torch.uint8, "kInt32": torch.int32, "kInt64": torch.int64, "kFloat32": torch.float32,
                "kFloat16": torch.float16, "kBFloat16": torch.bfloat16, "kFloat8E4M3": torch.float8_e4m3fn,
                "kFloat8E5M2": torch.float8_e5m2}

# The emulated accelerator: every tensor the emulation makes names it (never torch's default device).
EMULATED = torch.device("cpu")
# The CUDA version TE's code reads as torch.version.cuda (rewrite rule R9): the toolkit of the cuBLASLt 13.0 that
# tex.get_cublasLt_version reports (TE's FP8 block scaling asks for >= 12.9; CPU torch has None).
CUDA_VERSION = "13.0"
# The emulated device's SM count (an H100's 132), as torch.cuda.get_device_properties reports it and as kernels that
# size their grid by it (the fused MoE aux loss: 2 blocks per SM) read it.
SM_COUNT = 132

_CAPABILITY: list[str] = [DEFAULT_CAPABILITY]

# The cuBLASLt version tex.get_cublasLt_version reports (13.0 by default: TE's GroupedLinear then keeps its split-
# quantize path; >= 13.3 opens its grouped-tensor GEMM path, grouped_tensor_gemm.py). Chosen at boot from CUBLASLT_ENV
# ("13.3" or cuBLAS's integer 130300).
DEFAULT_CUBLASLT_VERSION = 130000
CUBLASLT_ENV = "TE_VERIFY_CUBLASLT"
_CUBLASLT: list[int] = [DEFAULT_CUBLASLT_VERSION]


class CapabilityError(ValueError):
    """An emulated capability the suite does not know; the message names the choices."""


def configure(name: str) -> None:
    if name not in CAPABILITIES:
        raise CapabilityError(f"emulated capability {name!r}: expected one of {', '.join(CAPABILITIES)}")
    _CAPABILITY[0] = name


def parse_cublaslt(text: str) -> int:
    """"13.3" (major.minor[.patch]) or cuBLAS's integer 130300 as that integer; anything else raises naming it."""
    parts = text.strip().split(".")
    if all(p.isdigit() for p in parts) and (len(parts) == 1 and len(parts[0]) >= 5 or 2 <= len(parts) <= 3):
        if len(parts) == 1:
            return int(parts[0])
        major, minor, patch = (int(p) for p in (parts + ["0"])[:3])
        if minor < 100 and patch < 100:
            return major * 10000 + minor * 100 + patch
    raise CapabilityError(f"emulated cuBLASLt version {text!r} ({CUBLASLT_ENV}): expected major.minor like 13.3, "
                          f"or cuBLAS's integer like 130300")


def configure_cublaslt(text: str | None) -> None:
    """The cuBLASLt version from its environment value (None or empty: the default, 13.0)."""
    _CUBLASLT[0] = parse_cublaslt(text) if text else DEFAULT_CUBLASLT_VERSION


def cublaslt_version() -> int:
    """tex.get_cublasLt_version(): cuBLAS's integer (130000 for 13.0)."""
    return _CUBLASLT[0]


def capability_name() -> str:
    return _CAPABILITY[0]


def capability() -> tuple[int, int]:
    return CAPABILITIES[_CAPABILITY[0]]


def sm_arch() -> int:
    """transformer_engine::cuda::sm_arch(): 10 * major + minor (90 for sm90)."""
    major, minor = capability()
    return 10 * major + minor


def non_tn_fp8_gemm() -> bool:
    """nvte_is_non_tn_fp8_gemm_supported (common/transformer_engine.cpp): sm 10.x/11.x and >= 13.0."""
    major, minor = capability()
    arch = 10 * major + minor
    return 100 <= arch < 120 or arch >= 130


def torch_dtype(te_dtype: Any) -> torch.dtype:
    """A tex.DType (or TE's constants.DType) as a torch dtype."""
    name = getattr(te_dtype, "name", str(te_dtype))
    if name not in TORCH_DTYPES:
        raise NotImplementedError(f"tex DType {name} has no torch dtype in the emulation")
    return TORCH_DTYPES[name]
