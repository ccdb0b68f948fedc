"""The storages of block-scaled quantized tensors, allocated and coerced as TE's C++ quantizers do.

Per quantizer (csrc/quantizer.cpp of TE 2.20.2: create_tensor, convert_and_update_tensor, get_scale_shape), with
M = prod(shape[:-1]), K = shape[-1], one set of buffers per usage the quantizer asks for:
- MXFP8Quantizer: uint8 data of the logical shape in both directions; uint8 E8M0 scales (roundup(M,128),
  roundup(K/32,4)) rowwise, (roundup(M/32,4), roundup(K,128)) columnwise; `_with_gemm_swizzled_scales` is the
  quantizer's optimize_for_gemm. Dims must divide by 32.
- Float8BlockQuantizer: uint8 data, the columnwise copy transposed (K, *shape[:-1]); fp32 scale_inv in TE's
  GEMM-ready layouts (get_scale_shape); never swizzled.
- NVFP4Quantizer: packed uint8 data (..., K/2) rowwise, (K, M/2) columnwise; uint8 E4M3 scales (roundup(M,128),
  roundup(K/16,4)) and (roundup(K,128), roundup(M/16,4)); one fp32 amax per direction (row-scaled: M rowwise, K
  columnwise; TE main's create_tensor). Scales are swizzled only where TE's kernel writes them so
  (nvfp4_emits_gemm_swizzled_scales). Dims must divide by 16. Row-scaled needs rowwise usage.
A usage not asked for leaves its buffers None (an existing output drops them); buffers are allocated uninitialised.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from te_verify.te.tecpu import device
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class

BLOCK_KINDS = ("MXFP8Quantizer", "Float8BlockQuantizer", "NVFP4Quantizer")
# Quantizer class -> (storage class, tensor class, the C++ error for an output of another type).
CLASSES = {
    "MXFP8Quantizer": ("MXFP8TensorStorage", "MXFP8Tensor", "MXFP8Quantizer must output to MXFP8Tensor."),
    "Float8BlockQuantizer": ("Float8BlockwiseQTensorStorage", "Float8BlockwiseQTensor",
                             "Float8BlockQuantizer must output to Float8BlockwiseQTensor."),
    "NVFP4Quantizer": ("NVFP4TensorStorage", "NVFP4Tensor", "NVFP4Quantizer must output to IsNVFP4Tensor."),
}
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]


def dims2(shape: tuple[int, ...]) -> tuple[int, int]:
    """get_2d_dims (csrc/common.cpp): all but the last dim flattened; a 0-D shape is 1x1."""
    return math.prod(shape[:-1]), (shape[-1] if shape else 1)


def transpose_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """make_transpose_shape (csrc/quantizer.cpp): the last dim first; a 0-D shape stays 0-D."""
    return (shape[-1], *shape[:-1]) if shape else shape


def untranspose_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The logical shape of a transposed (last-dim-first) copy."""
    return (*shape[1:], shape[0]) if shape else shape


def check_dims(kind: str, shape: tuple[int, ...]) -> None:
    """create_tensor's shape checks (MXFP8: both flat dims by 32; NVFP4: by 16)."""
    m, k = dims2(shape)
    if kind == "MXFP8Quantizer" and (m % 32 or k % 32):
        raise RuntimeError(f"MXFP8 requires tensor dims that are divisible by 32 (got shape={list(shape)})")
    if kind == "NVFP4Quantizer" and (m % 16 or k % 16):
        raise RuntimeError(f"NVFP4 requires tensor dims that are divisible by 16 (got shape={list(shape)})")


def check_usage(kind: str, q: Any) -> None:
    """create_tensor / convert_and_update_tensor: a row-scaled NVFP4 tensor always has its rowwise copy."""
    if kind == "NVFP4Quantizer" and q.row_scaled_nvfp4 and not q.rowwise_usage:
        raise RuntimeError("Row-scaled NVFP4 quantization requires rowwise usage.")


def check_nvfp4_options(q: Any) -> None:
    """The NVFP4 variant the emulation leaves to TE's GPU kernels and collectives."""
    if q.with_amax_reduction:
        refuse("NVFP4 amax reduction across ranks")


def check_nvfp4_kernel(q: Any, x: torch.Tensor) -> None:
    """TE main's refusals of option combinations (quantizer.cpp quantize_impl, dispatch/quantize.cuh), in order."""
    if q.nvfp4_use_4over6 and q.with_rht:
        raise RuntimeError("NVFP4 4over6 quantization does not support RHT.")
    if q.nvfp4_use_4over6 and q.stochastic_rounding:
        raise RuntimeError("NVFP4 4over6 quantization does not support stochastic rounding.")
    if q.nvfp4_use_4over6 and q.with_2d_quantization and not q.rowwise_usage:
        raise RuntimeError("NVFP4 4over6 2D quantization requires rowwise output.")
    if not q.row_scaled_nvfp4:
        return
    for option, name in ((q.with_rht, "RHT"), (q.with_2d_quantization, "2D quantization"),
                         (q.stochastic_rounding, "stochastic rounding")):
        if option:
            raise RuntimeError(f"Row-scaled NVFP4 quantization does not support {name}.")
    if q.columnwise_usage and q.nvfp4_use_4over6:
        raise RuntimeError("Row-scaled NVFP4 transpose quantization is not supported with 4over6 mode. The 4over6 "
                           "kernel does not consume the per-row/per-column amaxes, so the columnwise output would "
                           "be incorrect.")
    m, k = x.shape
    if q.columnwise_usage and (x.dtype != torch.bfloat16 or m % 32 or k % 32):
        raise RuntimeError("Row-scaled NVFP4 transpose quantization requires BF16 input and dimensions that are "
                           "multiples of 32.")


def nvfp4_swizzled(q: Any, shape: tuple[int, ...]) -> bool:
    """nvfp4_emits_gemm_swizzled_scales: the RHT cast-fusion kernel (rows % 64, cols % 128) or the plain 2D kernel
    (rows and cols % 128; neither row-scaled nor 4over6) write GEMM-swizzled scales, on sm 10.0-11.0, when the
    quantizer optimizes for GEMM."""
    m, k = dims2(shape)
    blackwell = 100 <= device.sm_arch() <= 110
    if not q.optimize_for_gemm or not blackwell:
        return False
    if q.with_rht:
        return m % 64 == 0 and k % 128 == 0
    plain_2d = q.with_2d_quantization and not q.row_scaled_nvfp4 and not q.nvfp4_use_4over6
    return bool(plain_2d) and m % 128 == 0 and k % 128 == 0


def specs(kind: str, q: Any, shape: tuple[int, ...]) -> tuple[Specs, Specs]:
    """(rowwise, columnwise) buffers: attribute -> (shape, dtype)."""
    m, k = dims2(shape)
    row_scale, col_scale = tuple(q.get_scale_shape(shape, False)), tuple(q.get_scale_shape(shape, True))
    u8, f32 = torch.uint8, torch.float32
    if kind == "MXFP8Quantizer":
        return ({"_rowwise_data": (shape, u8), "_rowwise_scale_inv": (row_scale, u8)},
                {"_columnwise_data": (shape, u8), "_columnwise_scale_inv": (col_scale, u8)})
    if kind == "Float8BlockQuantizer":
        return ({"_rowwise_data": (shape, u8), "_rowwise_scale_inv": (row_scale, f32)},
                {"_columnwise_data": (transpose_shape(shape), u8), "_columnwise_scale_inv": (col_scale, f32)})
    row_scaled = q.row_scaled_nvfp4
    return ({"_rowwise_data": ((*shape[:-1], k // 2), u8), "_rowwise_scale_inv": (row_scale, u8),
             "_amax_rowwise": ((m if row_scaled else 1,), f32)},
            {"_columnwise_data": ((k, m // 2), u8), "_columnwise_scale_inv": (col_scale, u8),
             "_amax_columnwise": ((k if row_scaled else 1,), f32)})


def _flags(kind: str, q: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    if kind == "MXFP8Quantizer":
        return {"fp8_dtype": q.dtype, "with_gemm_swizzled_scales": bool(q.optimize_for_gemm)}
    if kind == "Float8BlockQuantizer":
        return {"fp8_dtype": q.dtype, "is_2D_scaled": q.block_scaling_dim == 2}
    return {"fp4_dtype": q.dtype, "with_gemm_swizzled_scales": nvfp4_swizzled(q, shape),
            "row_scaled_nvfp4": bool(q.row_scaled_nvfp4), "nvfp4_use_4over6": bool(q.nvfp4_use_4over6),
            "nvfp4_e4m3_max": q.nvfp4_e4m3_max}


def _empty(spec: tuple[tuple[int, ...], torch.dtype], ref: torch.Tensor) -> torch.Tensor:
    return torch.empty(spec[0], dtype=spec[1], device=ref.device)


def allocate(kind: str, q: Any, shape: tuple[int, ...], fake_dtype: torch.dtype, ref: torch.Tensor) -> Any:
    """create_tensor: the buffers of the quantizer's usages, in its storage class (internal) or tensor class."""
    check_dims(kind, shape)
    check_usage(kind, q)
    rowwise, columnwise = specs(kind, q, shape)
    kwargs: dict[str, Any] = {name[1:]: None for name in (*rowwise, *columnwise)}
    for usage, group in ((q.rowwise_usage, rowwise), (q.columnwise_usage, columnwise)):
        if usage:
            kwargs.update({name[1:]: _empty(spec, ref) for name, spec in group.items()})
    kwargs.update(_flags(kind, q, shape), quantizer=q)
    storage, tensor, _ = CLASSES[kind]
    if q.internal:
        return te_class(storage)(fake_dtype=fake_dtype, **kwargs)
    return te_class(tensor)(shape=list(shape), dtype=fake_dtype, device=ref.device, **kwargs)


def logical_shape(kind: str, out: Any) -> tuple[int, ...]:
    """The high-precision shape a storage holds, from whichever data it has."""
    if out._rowwise_data is not None:
        shape = tuple(out._rowwise_data.shape)
        return (*shape[:-1], shape[-1] * 2) if kind == "NVFP4Quantizer" else shape
    if out._columnwise_data is None:
        raise RuntimeError(f"{CLASSES[kind][1]} has no data.")
    shape = tuple(out._columnwise_data.shape)
    if kind == "MXFP8Quantizer":
        return shape
    if kind == "NVFP4Quantizer":
        return (shape[1] * 2, shape[0])
    return untranspose_shape(shape)


def coerce(kind: str, q: Any, out: Any) -> tuple[int, ...]:
    """convert_and_update_tensor: allocate the buffers of requested usages that are missing, drop the others, set
    the format flags; returns the logical shape."""
    if not isinstance(out, te_class(CLASSES[kind][0])):
        raise RuntimeError(CLASSES[kind][2])
    shape = logical_shape(kind, out)
    check_usage(kind, q)
    ref = out._rowwise_data if out._rowwise_data is not None else out._columnwise_data
    for usage, group in zip((q.rowwise_usage, q.columnwise_usage), specs(kind, q, shape)):
        for name, spec in group.items():
            current = getattr(out, name)
            if not usage:
                setattr(out, name, None)
            elif current is None or (name.startswith("_amax") and current.numel() != math.prod(spec[0])):
                setattr(out, name, _empty(spec, ref))
    if kind != "Float8BlockQuantizer":  # TE's Python sets a block tensor's _fp8_dtype after the cast
        for flag, value in _flags(kind, q, shape).items():
            if flag != "fp4_dtype":
                setattr(out, f"_{flag}", value)
    return shape
