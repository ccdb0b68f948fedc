"""What TE's cublas_gemm and cuBLAS refuse before an FP8 GEMM runs, as the emulation must refuse it too.

A GEMM the hardware refuses is an error TE's Python sees and routes around (the FP8 block scaling recipe forces the
split accumulator; its modules compute bias gradients outside the GEMM); an emulation that computes it instead hides
a call that fails on a GPU. Checked in TE's order (common/gemm/cublaslt_gemm.cu):

- CanonicalizeGemmInput's operand rules: one scaling mode for both operands, or 1D and 2D FP8 block scaling;
  per-tensor FP8's leading dimensions a multiple of 16 (check_fp8_leading_dims); FP8 block scaling on sm90 with
  cuBLAS's tensor-core rules (leading dimension k a multiple of 16; m a multiple of 8; n too when B is 1D-scaled). On
  sm100 TE converts block-scaled operands to MXFP8 first (gemm.cpp), which has none of these.
- cublas_gemm's own checks for block scaling: not 2D by 2D; an epilogue among DEFAULT, BIAS and DGELU.
- cuBLAS's heuristic (cublasLtMatmulAlgoGetHeuristic), as TE reports it: NOT_SUPPORTED for fast accumulation
  (use_split_accumulator=False) with 128-element block scales and for E5M2 by E5M2 (cuBLAS's FP8 type table, any
  scaling; PyTorch's _scaled_mm refuses it too); INVALID_VALUE for an epilogue auxiliary whose type differs from a
  non-FP8 output's (cuBLASLt's CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: TE passes bias_type for FP8 inputs).
  TE's test_float8_blockwise_gemm_exact.py holds Hopper to each of these.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import block_fp8_gemm, block_quantize, device
from te_verify.te.tecpu.quantize import fp8_torch_dtype
from te_verify.te.tecpu.te_classes import shape_of, te_class

# TE's NVTE_CHECK text for a NOT_SUPPORTED heuristic; NVTE_CHECK_CUBLAS's for INVALID_VALUE (cublasGetStatusString).
NOT_SUPPORTED = ("Assertion failed: status != CUBLAS_STATUS_NOT_SUPPORTED. "
                 "Unable to find suitable cuBLAS GEMM algorithm")
INVALID_VALUE = "cuBLAS Error: an unsupported value or parameter was passed to the function"
_BLOCK_EPILOGUES = ("DEFAULT", "BIAS", "DGELU")  # cublas_gemm's list for float8 block scaled GEMM


def is_fp8(t: Any) -> bool:
    """A per-tensor-scaled FP8 operand."""
    return isinstance(t, te_class("Float8TensorStorage"))


# TE's NVTEScalingMode names (transformer_engine.cpp to_string) by operand format; a high-precision tensor's is the
# default, per-tensor scaling's.
_SCALING_MODES = {None: "NVTE_DELAYED_TENSOR_SCALING", "Float8": "NVTE_DELAYED_TENSOR_SCALING",
                  "MXFP8Quantizer": "NVTE_MXFP8_1D_SCALING", "NVFP4Quantizer": "NVTE_NVFP4_1D_SCALING"}
_BLOCK_MODES = {"NVTE_BLOCK_SCALING_1D", "NVTE_BLOCK_SCALING_2D"}


def scaling_mode(t: Any) -> str:
    """The NVTEScalingMode TE's C++ gives a GEMM operand."""
    kind = "Float8" if is_fp8(t) else block_quantize.kind_of(t)
    if kind == "Float8BlockQuantizer":
        return f"NVTE_BLOCK_SCALING_{'2D' if t._is_2D_scaled else '1D'}"
    return _SCALING_MODES[kind]


def check_scaling_modes(A: Any, B: Any) -> None:
    """cuBLAS's GEMM takes operands of one scaling mode, or 1D and 2D FP8 block scaling (cublaslt_gemm.cu,
    CanonicalizeGemmInput): anything else raises TE's error (a hybrid recipe's NVFP4 x FP8 backward, say)."""
    a, b = scaling_mode(A), scaling_mode(B)
    if a != b and {a, b} != _BLOCK_MODES:
        raise RuntimeError(f"Inputs A and B to GEMM need to have compatible scaling modes, but got A.scaling_mode = "
                           f"{a}, B.scaling_mode = {b}")


def check_fp8_leading_dims(A: Any, transA: bool, B: Any, transB: bool) -> None:
    """cuBLAS's leading-dimension rule for per-tensor FP8 as CanonicalizeGemmInput checks it: the leading dimension of
    the data each operand is read from a multiple of 16. sm90 reads both as TN (transposed copies where needed): k.
    sm100 reads any layout: A's rowwise data has k (transposed) or m, B's n (transposed) or k, and a copy read for
    want of rowwise data the other (m, n, k as cublas_gemm derives them from A's and B's flat dims)."""
    if not is_fp8(A):
        return
    m, n, k = _gemm_dims(A, transA, B, transB)
    lda = ldb = k
    if device.non_tn_fp8_gemm():
        a_rows, b_rows = A._data is not None, not is_fp8(B) or B._data is not None
        lda = (k if transA else m) if a_rows else (m if transA else k)
        ldb = (n if transB else k) if b_rows else (k if transB else n)
    if lda % 16:
        raise RuntimeError("Leading dimension requirement on A for FP8 GEMM. Caller must pad.")
    if ldb % 16:
        raise RuntimeError("Leading dimension requirement on B for FP8 GEMM. Caller must pad.")


def epilogue(has_bias: bool, gelu: bool, grad: bool) -> str:
    """The cuBLASLt epilogue cublas_gemm configures (without its CUBLASLT_EPILOGUE_ prefix)."""
    if has_bias and gelu:
        return "DGELU_BGRAD" if grad else "GELU_AUX_BIAS"
    if has_bias:
        return "BGRADB" if grad else "BIAS"
    if gelu:
        return "DGELU" if grad else "GELU_AUX"
    return "DEFAULT"


def admit(A: Any, transA: bool, B: Any, transB: bool, *, epilogue_name: str = "DEFAULT",
          out_dtype: torch.dtype | None = None, aux_dtype: torch.dtype | None = None,
          use_split_accumulator: bool = True) -> None:
    """Raise as TE would for a GEMM it or cuBLAS refuses, in TE's order (the module's docstring)."""
    check_scaling_modes(A, B)
    check_fp8_leading_dims(A, transA, B, transB)
    blockwise = block_fp8_gemm.applies(A, B)
    if blockwise:
        _check_block_dims(A, transA, B, transB)
        if A._is_2D_scaled and B._is_2D_scaled:
            raise RuntimeError("Only 1D by 1D, 1D by 2D, and 2D by 1D block scaling GEMM is supported, but got "
                               "2D by 2D")
        if epilogue_name not in _BLOCK_EPILOGUES:
            raise RuntimeError(f"Epilogue requested outside of the available and tested cuBLAS functionality for "
                               f"float8 block scaled GEMM (CUBLASLT_EPILOGUE_{epilogue_name})")
        if not use_split_accumulator:
            raise RuntimeError(f"{NOT_SUPPORTED} (fast accumulation with 128-element block scales)")
    if _fp8_dtypes(A, B) == {torch.float8_e5m2}:
        raise RuntimeError(f"{NOT_SUPPORTED} (E5M2 by E5M2)")
    if blockwise and aux_dtype is not None and aux_dtype != out_dtype:
        raise RuntimeError(f"{INVALID_VALUE} (epilogue auxiliary {aux_dtype} for a {out_dtype} output)")


def _fp8_dtypes(A: Any, B: Any) -> set[torch.dtype]:
    """The two FP8 formats of a per-tensor or block-scaled FP8 GEMM; empty for any other."""
    fp8 = (te_class("Float8TensorStorage"), te_class("Float8BlockwiseQTensorStorage"))
    if not all(isinstance(t, fp8) for t in (A, B)):
        return set()
    return {fp8_torch_dtype(t._fp8_dtype) for t in (A, B)}


def _gemm_dims(A: Any, transA: bool, B: Any, transB: bool) -> tuple[int, int, int]:
    """cublas_gemm's m, n, k (column-major) from A's and B's flat 2-D dims."""
    (a0, a1), (b0, b1) = dims2(shape_of(A)), dims2(shape_of(B))
    m, k = (a0, a1) if transA else (a1, a0)
    return m, (b1 if transB else b0), k


def _check_block_dims(A: Any, transA: bool, B: Any, transB: bool) -> None:
    """CanonicalizeGemmInput's FP8 block scaling rules."""
    m, n, k = _gemm_dims(A, transA, B, transB)
    if k % 16:
        raise RuntimeError("Leading dimension requirement on NVTE_BLOCK_SCALING GEMM. Caller must pad.")
    if m % 8:
        raise RuntimeError("Outer dimension requirement on A for NVTE_BLOCK_SCALING GEMM. Caller must pad.")
    if not B._is_2D_scaled and n % 8:  # "observed only when B is 1D quantized" (cublaslt_gemm.cu)
        raise RuntimeError("Outer dimension requirement on B for NVTE_BLOCK_SCALING GEMM. Caller must pad.")


def dims2(shape: tuple) -> tuple[int, int]:
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows, shape[-1]
