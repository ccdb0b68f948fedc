"""The GEMM of te_verify.te.reference (functional.gemm) issued another way, for pure-PyTorch TE builds in tests
(split_k_ref_build, split_n_ref_build, transposed_ref_build: each a `--te-impl` module, measured below aten like any
user's build). "split_k": two GEMMs over the halves of K (column and row slices of the operands), their fp32 partial
sums added; "split_n": two GEMMs over the halves of the output columns (column slices of B), concatenated;
"transposed": (B^T A^T)^T over transposed contiguous copies of both operands. Each spends the same FLOPs as the
reference. Planted: "split_k_extra" runs every GEMM's first half once more, its result thrown away.

A mode applies only while the active --te-impl is the build that installed it: the same reference also serves as the
checks' same-quantization reference (te_verify.run.te_case), which must compute as it always does.
"""
from __future__ import annotations

import torch

from te_verify.te import api as te_api
from te_verify.te.reference import functional

ORIGINAL = functional.gemm
_BUILDS: dict[str, str] = {}  # --te-impl module name -> mode


def split_k(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    half = a.shape[1] // 2
    if not half:
        return ORIGINAL(layer, role, a, b, fp8)
    return ORIGINAL(layer, role, a[:, :half], b[:half], fp8) + ORIGINAL(layer, role, a[:, half:], b[half:], fp8)


def split_n(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    half = b.shape[1] // 2
    if not half:
        return ORIGINAL(layer, role, a, b, fp8)
    return torch.cat([ORIGINAL(layer, role, a, b[:, :half], fp8), ORIGINAL(layer, role, a, b[:, half:], fp8)], 1)


def _transposed_copy(t: torch.Tensor) -> torch.Tensor:
    return t.t().clone(memory_format=torch.contiguous_format)  # a copy even where t.t() is contiguous


def transposed(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    return ORIGINAL(layer, role, _transposed_copy(b), _transposed_copy(a), fp8).t()


def split_k_extra(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    half = a.shape[1] // 2
    if half:
        ORIGINAL(layer, role, a[:, :half], b[:half], fp8)  # thrown away: work the case does not need
    return split_k(layer, role, a, b, fp8)


GEMMS = {"split_k": split_k, "split_n": split_n, "transposed": transposed, "split_k_extra": split_k_extra}


def _gemm(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    mode = _BUILDS.get(te_api.active().name)
    return (GEMMS[mode] if mode else ORIGINAL)(layer, role, a, b, fp8)


def install(mode: str, build: str) -> None:
    """`mode`'s GEMM wherever the reference runs as --te-impl `build`."""
    _BUILDS[build] = mode
    functional.gemm = _gemm
