"""tex's GEMMs in PyTorch: generic_gemm and te_general_grouped_gemm, with TE's layouts and epilogues.

Row-major reading of TE's cuBLAS call: out = op(B) @ op(A), op transposing where the flag says "T"
(fprop "TN": x @ W^T; dgrad "NN": dy @ W; wgrad "NT": dy^T @ x). Per-tensor FP8 operands follow
CanonicalizeGemmInput (common/gemm/cublaslt_gemm.cu): on a TN-only device (sm90) an operand used untransposed
(A) or transposed (B) must come from its columnwise (explicitly transposed) copy, and an FP8 GEMM needs its
leading dimensions divisible by 16; a missing copy raises as TE's C++ does. FP8 values are multiplied
exactly and accumulated in fp32, then scaled by both scale_invs (cuBLAS's FP8 alpha); cuBLAS's reduced-
precision fast accumulation is not modelled. FP8 block scaling on sm90 is accumulated K tile by K tile, as cuBLAS's
blockwise kernel (block_fp8_gemm.py); other block-scaled operands (MXFP8, FP8 block scaling on sm100, NVFP4) are read
from the copy TE's C++ picks (rowwise for A transposed / B not transposed, else columnwise), each dequantized by its own
block scales (block_quantize.gemm_operand), multiplied in fp32 and scaled by their per-tensor factors (1 for MXFP8
and FP8 block scaling; for NVFP4 cuBLAS's alpha as nvfp4.cu computes it from both amaxes and E4M3 maxes,
nvfp4.gemm_alpha; a row-scaled NVFP4 operand raises as cublaslt_gemm.cu does: TE's Python applies per-row amaxes
around the GEMM). Epilogues (cuBLASLt's, as gemm.cpp configures them): bias add (forward), bias gradient = column
sums of B (grad=True); GELU (GELU_AUX[_BIAS]: the pre-activation returned as pre_gelu_out, the output TE's tanh GELU
of its fp32 value) and its backward (DGELU[_BGRAD]: the product times gelu'(gelu_in), the bias gradient then its
column sums), with TE's math.h formulas for cuBLAS's own (the same tanh approximation: within rounding, not
bitwise). The grouped GEMM's GELU and comm+GEMM overlap are refused. What TE's C++ or cuBLAS refuse before a GEMM runs
(scaling modes, leading dimensions, blockwise FP8's epilogues and accumulation) is gemm_admission.py's.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from te_verify.te.tecpu import block_fp8_gemm, block_quantize, device, nvfp4
from te_verify.te.tecpu.activation import FORMULAS
from te_verify.te.tecpu.gemm_admission import admit, dims2, epilogue, is_fp8
from te_verify.te.tecpu.quantize import fp8_torch_dtype, quantize as tex_quantize
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import shape_of, te_class
from te_verify.te.tecpu.writes import write


def _untranspose(t: torch.Tensor) -> torch.Tensor:
    """A columnwise copy (last dim first) back to the logical 2-D matrix."""
    return t.reshape(t.shape[0], -1).t()


def _fp8_operand(t: Any, name: str, use_columnwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(logical 2-D FP8 values as fp32, scale_inv) from the copy TE's GEMM would read."""
    if use_columnwise:
        if t._transpose is None or t._transpose_invalid:  # type_converters.cpp passes only a valid transpose
            raise RuntimeError(f"Input {name} is missing column-wise usage")
        data = _untranspose(t._transpose)
    else:
        if t._data is None:
            raise RuntimeError(f"Input {name} is missing row-wise usage")
        data = t._data.reshape(-1, t._data.shape[-1])
    return data.view(fp8_torch_dtype(t._fp8_dtype)).float(), t._scale_inv.float().reshape(())


# (values, per-tensor factor: a scale_inv, NVFP4's GlobalScale, None for high precision; format)
Operand = tuple[torch.Tensor, "torch.Tensor | nvfp4.GlobalScale | None", "str | None"]


def _operand(t: Any, name: str, trans: bool) -> Operand:
    """The logical 2-D operand (as stored, before op()), its scale factor and format when quantized."""
    wants_columnwise = (not trans) if name == "A" else trans
    if is_fp8(t):
        # sm90: A untransposed / B transposed come from the columnwise copy (the rest from rowwise data, which must
        # exist); sm100 reads the rowwise data, or the columnwise copy when there is none.
        columnwise = t._data is None if device.non_tn_fp8_gemm() else wants_columnwise
        return (*_fp8_operand(t, name, columnwise), "Float8")
    if block_quantize.kind_of(t) is not None:
        return block_quantize.gemm_operand(t, name, use_rowwise=not wants_columnwise)
    if isinstance(t, te_class("QuantizedTensorStorage")):
        refuse(f"tex GEMM on a {type(t).__name__} operand")
    return t.reshape(-1, t.shape[-1]), None, None


def output_shape(a_shape: tuple, transa: bool, b_shape: tuple, transb: bool) -> list[int]:
    """getGemmOutputShape (csrc/extensions/gemm.cpp): B's leading dims unflattened, then A's output dim."""
    a0, a1 = dims2(a_shape)
    b0, b1 = dims2(b_shape)
    if (a1 if transa else a0) != (b0 if transb else b1):
        raise RuntimeError(f"Invalid matrix dimensions for GEMM (A=({a0},{a1}), transa={int(transa)}, "
                           f"B=({b0},{b1}), transb={int(transb)})")
    lead = [b1] if transb else list(b_shape[:-1])
    return lead + [a0 if transa else a1]


def product(a_op: Operand, transa: bool, b_op: Operand, transb: bool) -> torch.Tensor:
    """op(B) @ op(A) in fp32; quantized operands multiplied as their (block-scaled) values, then scaled by both
    per-tensor factors (scale_inv_A * scale_inv_B)."""
    (a, a_si, a_format), (b, b_si, _) = a_op, b_op
    if (a_si is None) != (b_si is None):
        refuse("a GEMM mixing FP8 and high-precision operands")
    opa = a.float().t() if transa else a.float()
    opb = b.float().t() if transb else b.float()
    nvfp4_gemm = a_format == "NVFP4Quantizer"
    # cuBLAS is no aten op: a caller's torch.autocast never reaches it (under one, this matmul ran in bf16 and the bias
    # epilogue rounded twice).
    with torch.autocast(opa.device.type, enabled=False):
        result = nvfp4.block_ordered_matmul(opb, opa) if nvfp4_gemm else opb @ opa
    if nvfp4_gemm:
        return result * nvfp4.gemm_alpha(a_si, b_si)
    return result * (a_si * b_si) if a_si is not None else result


def operand_values(op: Operand) -> torch.Tensor:
    """An operand's fp32 values with its per-tensor factor applied (the bias-gradient epilogue reads them)."""
    values, factor, kind = op
    if factor is None:
        return values.float()
    return values * (nvfp4.per_tensor_factor(factor) if kind == "NVFP4Quantizer" else factor)


def _out_dtype(output_dtype: Any, A: Any) -> torch.dtype:
    if output_dtype is not None:
        return device.torch_dtype(output_dtype)
    if isinstance(A, te_class("QuantizedTensorStorage")):
        refuse("generic_gemm of quantized operands without an output dtype")
    return A.dtype


def _write(result: torch.Tensor, D: torch.Tensor | None, shape: list[int], dtype: torch.dtype,
           accumulate: bool, beta: float) -> torch.Tensor:
    result = result.reshape(shape)
    if D is None:
        return result.to(dtype)
    _check_d(D, shape, dtype)
    write(D, result + beta * D.float() if accumulate else result)
    return D


def _check_d(D: torch.Tensor, shape: list[int], dtype: torch.dtype) -> None:
    if list(D.shape) != shape:
        raise RuntimeError(f"GEMM output has invalid dims (expected {shape}, got {list(D.shape)})")
    if D.dtype != dtype:
        raise RuntimeError(f"GEMM output has invalid dtype (expected {dtype}, found {D.dtype})")


def _plus_c(result: torch.Tensor, A: Any, B: Any, D: torch.Tensor, shape: list[int], dtype: torch.dtype,
            beta: float) -> torch.Tensor:
    """alpha * AB (+ bias) + beta * C, C being D's values: what a GELU epilogue's activation or gradient acts on."""
    _check_d(D, shape, dtype)
    return _before_c(result, A, B, dtype, True) + beta * D.float().reshape(result.shape)


def generic_gemm(A: Any, transA: bool, B: Any, transB: bool, D: Any, quantizer: Any, output_dtype: Any,
                 bias: torch.Tensor | None, bias_type: Any, gelu: bool, gelu_in: Any, grad: bool,
                 workspace: torch.Tensor, workspace_size: int, accumulate: bool, use_split_accumulator: bool,
                 comm_overlap: Any = None, comm_type: Any = None, extra_output: Any = None,
                 bulk_overlap: bool = False, alpha: float = 1.0, beta: float | None = None) -> list:
    """tex.generic_gemm: returns [D, bias_grad, pre_gelu_out, extra_output] as TE's C++ does."""
    if comm_overlap is not None or bulk_overlap:
        refuse("generic_gemm with comm+GEMM overlap (userbuffers)")
    beta = (1.0 if accumulate else 0.0) if beta is None else beta
    if not accumulate and beta != 0.0:
        raise RuntimeError("Trying to use non-zero beta while not accumulating into D tensor. "
                           "Beta has nothing to be applied to.")
    shape = output_shape(shape_of(A), transA, shape_of(B), transB)
    dtype = _out_dtype(output_dtype, A)
    if D is not None and output_dtype is not None and D.dtype != device.torch_dtype(output_dtype):
        raise RuntimeError(f"GEMM output has invalid dtype (expected {dtype}, found {D.dtype})")
    if math.prod(shape_of(A)) == 0 or math.prod(shape_of(B)) == 0:
        return _without_operands(A, B, D, quantizer, shape, dtype, bias, bias_type, gelu, grad, accumulate, extra_output)
    admit(A, transA, B, transB, epilogue_name=epilogue(bias is not None and (grad or bias.numel() > 0), gelu, grad),
          out_dtype=dtype, aux_dtype=_gelu_dtype(A, B, bias_type, dtype) if gelu else None,
          use_split_accumulator=use_split_accumulator)
    b_op = _b_operand(A, B, transB)
    result = _product(A, transA, B, transB, b_op) * alpha  # D = alpha * AB + bias (gemm.h)
    if bias is not None and not grad and bias.numel():
        result = result + bias.float()
    c_first = gelu and accumulate and D is not None  # cuBLAS's activation acts on alpha * AB + beta * C + bias
    if c_first:
        result = _plus_c(result, A, B, D, shape, dtype, beta)
    bias_grad, pre_gelu = None, None
    if grad and gelu:  # DGELU(_BGRAD): the product times gelu' of the forward's pre-activation
        if gelu_in is None:
            raise RuntimeError("generic_gemm: a GELU backward epilogue needs gelu_in (the forward's pre-activation)")
        result = result * FORMULAS["gelu"][1](gelu_in.float().reshape(result.shape))
    if bias is not None and grad:  # BGRADB sums B; DGELU_BGRAD the GELU gradient it wrote
        bias_grad = (result.sum(0) if gelu else operand_values(b_op or _operand(B, "B", transB)).sum(0)).to(dtype)
    if gelu and not grad:  # GELU_AUX(_BIAS): the pre-activation kept (in the output's dtype, bias_type's if FP8)
        pre_gelu = result.reshape(shape).to(_gelu_dtype(A, B, bias_type, dtype))
        result = FORMULAS["gelu"][0](result)
    if quantizer is not None:
        if accumulate or D is not None:
            refuse("generic_gemm quantizing its output into an existing or accumulated D")
        return [tex_quantize(result.reshape(shape).to(dtype), quantizer), bias_grad, pre_gelu, extra_output]
    add_c = accumulate and not c_first
    return [_write(_before_c(result, A, B, dtype, add_c), D, shape, dtype, add_c, beta), bias_grad, pre_gelu,
            extra_output]


def _b_operand(A: Any, B: Any, transB: bool) -> Operand | None:
    """B's dequantized operand for product(); None where the blockwise GEMM reads B's FP8 bytes itself (a bias
    gradient then dequantizes it on demand)."""
    return None if block_fp8_gemm.applies(A, B) else _operand(B, "B", transB)


def _product(A: Any, transA: bool, B: Any, transB: bool, b_op: Operand | None = None) -> torch.Tensor:
    """op(B) @ op(A) in fp32: cuBLAS's blockwise accumulation for FP8 block scaling on sm90, else product() (of
    B's operand b_op when the caller has it)."""
    if block_fp8_gemm.applies(A, B):
        return block_fp8_gemm.product(A, transA, B, transB)
    return product(_operand(A, "A", transA), transA, b_op or _operand(B, "B", transB), transB)


def _before_c(result: torch.Tensor, A: Any, B: Any, dtype: torch.dtype, accumulate: bool) -> torch.Tensor:
    """The result C is added to: cuBLAS's blockwise FP8 epilogue rounds it to the output dtype first."""
    return result.to(dtype).float() if accumulate and block_fp8_gemm.applies(A, B) else result


def _without_operands(A: Any, B: Any, D: Any, quantizer: Any, shape: list[int], dtype: torch.dtype,
                      bias: torch.Tensor | None, bias_type: Any, gelu: bool, grad: bool, accumulate: bool,
                      extra_output: Any) -> list:
    """gemm.cpp when A or B holds no element (a GEMM over zero tokens): no GEMM runs, so no scale is read; D is zeroed
    unless accumulating (then left as it is), the bias gradient zeroed, no bias added. Buffers the C++ allocates and
    leaves unwritten (a fresh D it accumulates into, the GELU pre-activation) are zeros here."""
    zeros = torch.zeros(shape, dtype=dtype, device=device.EMULATED)
    if D is not None and accumulate:
        pass  # D keeps what it holds
    elif quantizer is not None:
        D = tex_quantize(zeros, quantizer)
    else:
        D = _write(zeros, D, shape, dtype, False, 0.0)
    bias_grad = None
    if bias is not None and grad:
        bias_grad = torch.zeros(shape_of(B)[-1], dtype=dtype, device=device.EMULATED)
    pre_gelu = None
    if gelu and not grad:
        pre_gelu = torch.zeros(shape, dtype=_gelu_dtype(A, B, bias_type, dtype), device=device.EMULATED)
    return [D, bias_grad, pre_gelu, extra_output]


def _gelu_dtype(A: Any, B: Any, bias_type: Any, dtype: torch.dtype) -> torch.dtype:
    """gemm.cpp's gelu_type: bias_type for quantized operands (low_precision), else the output's dtype."""
    low_precision = any(isinstance(t, te_class("QuantizedTensorStorage")) for t in (A, B))
    return device.torch_dtype(bias_type) if low_precision else dtype


def te_general_grouped_gemm(A: list, transa: bool, B: list, transb: bool, D: list | None, D_type: Any,
                            m_splits: list[int], bias: list, bias_type: Any, single_output: bool,
                            pre_gelu_out: list, grad: bool, workspace: list, workspaceSize: int,
                            accumulate: bool, use_split_accumulator: bool, math_sm_count: int = 0) -> list:
    """tex.te_general_grouped_gemm: one GEMM per group into D[i] (or consecutive slices of D[0])."""
    if single_output and D is None:
        raise RuntimeError("not implemented, D should be allocated for single output case.")
    if any(t.numel() for t in pre_gelu_out):
        refuse("te_general_grouped_gemm with a GELU epilogue")
    dtype = device.torch_dtype(D_type)
    offset = 0
    for i, (a, b) in enumerate(zip(A, B)):
        shape = output_shape(shape_of(a), transa, shape_of(b), transb)
        rows = shape[0] * shape[1] if len(shape) == 2 else None
        if single_output:
            out = D[0].reshape(-1)[offset:offset + rows].view(shape) if rows else None
            offset += rows or 0
        else:
            out = D[i] if D is not None else None
        if math.prod(shape_of(a)) == 0 or math.prod(shape_of(b)) == 0:  # TE's storages have no numel()
            if out is not None and out.numel() and not accumulate:
                write(out, 0)
            if bias[i].numel() and grad:
                write(bias[i], 0)
            continue
        admit(a, transa, b, transb, epilogue_name=epilogue(bias[i].numel() > 0, False, grad), out_dtype=dtype,
              use_split_accumulator=use_split_accumulator)
        b_op = _b_operand(a, b, transb)
        result = _product(a, transa, b, transb, b_op)
        if bias[i].numel() and grad:
            write(bias[i], operand_values(b_op or _operand(b, "B", transb)).sum(0))
        elif bias[i].numel():
            result = result + bias[i].float()
        _write(_before_c(result, a, b, dtype, accumulate), out, shape, dtype, accumulate,
               1.0 if accumulate else 0.0)  # into D's tensors, never D itself
    return bias
