"""tex.group_quantize and tex.bgrad_group_quantize (csrc/extensions/cast.cpp): a GroupedTensor's groups quantized
into one packed storage, and the per-group bias gradient.

TE's kernel quantizes each group as the per-tensor quantizer quantizes that group alone (its own amax, scales and
padding; TE's test_grouped_tensor checks the packed buffers against per-tensor quantization, concatenated). So does
the emulation: the output is TE's own packed storage (GroupedTensorStorage.make_grouped_tensor: the buffers, their
per-group offsets and views), and each group's elements, located by the storage's element offsets, are quantized into
its view by the emulated tex.quantize. Current scaling's per-group amax and scale are also written into the storage's
`amax` and `scale`, as cast.cpp's compute_grouped_fp8_current_scaling_amax_and_scale does. What cast.cpp refuses
raises its error; a quantizer kind it does not dispatch raises its error too.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from te_verify.te.tecpu import block_quantize, device, quantize
from te_verify.te.tecpu.te_classes import te_class
from te_verify.te.tecpu.writes import write

_GROUPED_KINDS = ("MXFP8Quantizer", "NVFP4Quantizer", "Float8CurrentScalingQuantizer", "Float8BlockQuantizer")
_BGRAD_KINDS = ("MXFP8Quantizer", "Float8BlockQuantizer")
# What split_into_quantized_tensors caches on the storage; TE's C++ reads a grouped tensor without writing them.
_SPLIT_CACHES = ("tensor_shapes", "offsets", "scale_inv_offsets", "columnwise_scale_inv_offsets")


def _kind(quantizer: Any) -> str | None:
    return next((k for k in _GROUPED_KINDS if isinstance(quantizer, te_class(k))), None)


def _reuse(output: Any, quantizer: Any, num_tensors: int, shape: list[int], uniform: bool) -> Any:
    """cast.cpp's checks on a destination handed back for reuse (weight caching, CUDA graph replay)."""
    if not uniform:
        raise RuntimeError("group_quantize: output reuse currently requires uniform tensor shapes.")
    if output.num_tensors != num_tensors:
        raise RuntimeError("group_quantize: output has a different number of tensors.")
    if list(output.logical_shape) != shape:
        raise RuntimeError("group_quantize: output has an incompatible logical shape.")
    if output.quantizer is None:
        raise RuntimeError("group_quantize: output must have quantized storage.")
    if output.quantizer is not quantizer:
        raise RuntimeError("group_quantize: output must have been created by the same quantizer.")
    return output


def _packed(num_tensors: int, first_dims: torch.Tensor | None, last_dims: torch.Tensor | None, shape: tuple,
            quantizer: Any, dtype: torch.dtype, tensor_offsets: torch.Tensor | None) -> Any:
    """TE's own packed storage for the groups; the caller's element offsets (precomputed on the device), where given,
    are what TE's kernel reads."""
    rows, cols = shape
    grouped = te_class("GroupedTensorStorage").make_grouped_tensor(num_tensors, first_dims, last_dims, rows, cols,
                                                                   quantizer, device.EMULATED, dtype)
    if tensor_offsets is not None:
        grouped.tensor_offsets, grouped.offsets = tensor_offsets, tensor_offsets.tolist()
    return grouped


def group_views(grouped: Any) -> list:
    """A GroupedTensor's per-group tensors (views of its buffers) as its C++ wrapper addresses them."""
    saved = {name: getattr(grouped, name, None) for name in _SPLIT_CACHES}
    try:
        views = grouped.split_into_quantized_tensors()
    finally:
        for name, value in saved.items():
            setattr(grouped, name, value)
    if grouped.quantizer is not None:
        for view in views:
            if hasattr(view, "_with_gemm_swizzled_scales"):
                view._with_gemm_swizzled_scales = grouped._with_gemm_swizzled_scales
    return list(views)


def _group_inputs(tensor: torch.Tensor, grouped: Any) -> list[torch.Tensor]:
    """Each group's elements, as the kernel locates them: the storage's element offsets into the flat input."""
    flat, offsets = tensor.reshape(-1), grouped.offsets
    return [flat[offsets[i]:offsets[i] + math.prod(shape)].view(shape)
            for i, shape in enumerate(grouped.tensor_shapes[:grouped.num_tensors])]


def _quantize_groups(tensor: torch.Tensor, quantizer: Any, grouped: Any,
                     noop_flag: torch.Tensor | None) -> list[torch.Tensor]:
    """Each group quantized into its view; current scaling's amax and scale into the storage. Returns the groups."""
    inputs = _group_inputs(tensor, grouped)
    current = _kind(quantizer) == "Float8CurrentScalingQuantizer" and not quantize.noop(noop_flag)
    for i, (x, view) in enumerate(zip(inputs, grouped.split_into_quantized_tensors())):
        quantize.quantize(x, quantizer, output=view, noop_flag=noop_flag)
        if current:
            amax = quantize.amax_of(x) if x.numel() else torch.zeros((), device=device.EMULATED)
            scale = quantize.current_scale(quantizer, amax).reshape(1)
            write(grouped.amax[i:i + 1], amax.reshape(1))
            write(grouped.scale[i:i + 1], scale)
            if not x.numel():  # an empty group: the kernel still writes its 1 / scale (quantize writes none)
                write(view._scale_inv, torch.reciprocal(scale).reshape(view._scale_inv.shape))
    return inputs


def group_quantize(tensor: torch.Tensor, quantizer: Any, num_tensors: int, first_dims: torch.Tensor | None = None,
                   last_dims: torch.Tensor | None = None, tensor_offsets: torch.Tensor | None = None,
                   noop_flag: torch.Tensor | None = None, output: Any = None) -> Any:
    """The packed storage of `tensor`'s `num_tensors` groups, each quantized as `quantizer` quantizes it alone."""
    if tensor.dim() != 2:
        raise RuntimeError("Tensor must be 2D")
    uniform = first_dims is None and last_dims is None and tensor_offsets is None
    if output is not None:
        grouped = _reuse(output, quantizer, num_tensors, list(tensor.shape), uniform)
    else:
        grouped = _packed(num_tensors, first_dims, last_dims, tensor.shape, quantizer, tensor.dtype, tensor_offsets)
    if tensor.numel() == 0:
        return grouped
    kind = _kind(quantizer)
    if kind is None:
        raise RuntimeError("group_quantize: only supports MXFP8, NVFP4, Float8CurrentScalingQuantizer, or "
                           "Float8Blockwise quantizer.")
    if kind == "NVFP4Quantizer" and last_dims is not None:
        raise RuntimeError("group_quantize: varying last dim is not supported with NVFP4.")
    _quantize_groups(tensor, quantizer, grouped, noop_flag)
    return grouped


def bgrad_group_quantize(tensor: torch.Tensor, quantizer: Any, num_tensors: int,
                         first_dims: torch.Tensor | None = None, last_dims: torch.Tensor | None = None,
                         tensor_offsets: torch.Tensor | None = None) -> tuple[Any, torch.Tensor]:
    """group_quantize, and each group's column sums ([num_tensors, last dim], the input's dtype, fp32 sums)."""
    if tensor.dim() != 2:
        raise RuntimeError("Tensor must be 2D")
    if last_dims is not None:
        raise RuntimeError("bgrad_group_quantize: varying last dim is not supported because the underlying MXFP8 "
                           "dbias kernel requires a constant last dimension across grouped tensors.")
    if _kind(quantizer) not in _BGRAD_KINDS:
        raise RuntimeError("bgrad_group_quantize: only MXFP8 and FP8 block-scaling quantizers are supported.")
    grouped = _packed(num_tensors, first_dims, None, tensor.shape, quantizer, tensor.dtype, tensor_offsets)
    if tensor.numel() == 0:
        return grouped, torch.zeros(num_tensors, tensor.shape[1], dtype=tensor.dtype, device=device.EMULATED)
    inputs = _quantize_groups(tensor, quantizer, grouped, None)
    return grouped, torch.stack([x.float().sum(0) for x in inputs]).to(tensor.dtype)


def group_dequantize(input: Any, otype: Any) -> Any:
    """A high-precision GroupedTensor of `input`'s groups, each dequantized into its view as tex.dequantize does."""
    rows, cols = input.logical_shape
    out = _packed(input.num_tensors, input.first_dims, input.last_dims, (rows, cols), None, device.torch_dtype(otype),
                  input.tensor_offsets)
    if rows and cols:
        for view, group in zip(out.split_into_quantized_tensors(), input.split_into_quantized_tensors()):
            write(view, _dequantized(group, otype))
    return out


def _dequantized(group: Any, otype: Any) -> torch.Tensor:
    """tex.dequantize's values, and FP8 block scaling's too: cast.cpp's grouped dequantize dispatches it (block scales
    in fp32), the per-tensor one does not (TE's Python dequantizes those itself)."""
    if block_quantize.kind_of(group) != "Float8BlockQuantizer":
        return quantize.dequantize(group, otype)
    rowwise = group._rowwise_data is not None
    return block_quantize.block_values(group, rowwise, gemm=False).to(device.torch_dtype(otype))


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"group_quantize": group_quantize, "bgrad_group_quantize": bgrad_group_quantize,
            "group_dequantize": group_dequantize}
