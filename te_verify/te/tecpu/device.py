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


class CapabilityError(ValueError):
    """An emulated capability the suite does not know; the message names the choices."""


def configure(name: str) -> None:
    if name not in CAPABILITIES:
        raise CapabilityError(f"emulated capability {name!r}: expected one of {', '.join(CAPABILITIES)}")
    _CAPABILITY[0] = name


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
