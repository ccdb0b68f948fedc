"""tex's per-tensor FP8 functions in PyTorch: quantize, dequantize, bgrad_quantize, the delayed-scaling update.

Semantics follow TE's C++ (csrc/quantizer.cpp, csrc/extensions/cast.cpp and bias.cpp of the
transformer-engine-torch sdist; common/recipe/*.cu{,h}):
- Float8Quantizer (DelayedScaling): cast x * scale with saturation; amax = max(amax, max|x|) (the kernel's
  atomic max into the quantizer's amax slot); scale_inv = 1 / scale.
- Float8CurrentScalingQuantizer: amax = max|x| of this tensor, scale = compute_scale_from_amax (epsilon
  floor, 1.0 for 0/inf/NaN amax, fp32-max for an infinite scale, optional power-of-2), then the cast.
- Storage as TE allocates it: uint8 rowwise data iff rowwise usage (or the device runs non-TN FP8 GEMMs),
  uint8 transposed data iff columnwise usage on a TN-only device (sm90); scale_inv one fp32 element.
The block-scaled quantizers (MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer) go to block_quantize.py; any
other quantizer is refused: the case errors, naming it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_quantize, block_storage, device
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class
from te_verify.te.tecpu.writes import write

FP8_DTYPES = {"kFloat8E4M3": torch.float8_e4m3fn, "kFloat8E5M2": torch.float8_e5m2}
FLOAT32_MAX = torch.finfo(torch.float32).max


def fp8_torch_dtype(te_dtype: Any) -> torch.dtype:
    name = getattr(te_dtype, "name", str(te_dtype))
    if name not in FP8_DTYPES:
        refuse(f"FP8 cast to {name}")
    return FP8_DTYPES[name]


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """The columnwise ("transpose") layout TE stores on TN-only devices (a 0-D tensor is its own, as a 1x1)."""
    shape = tuple(x.shape)
    return x.reshape(block_storage.dims2(shape)).t().contiguous().reshape(block_storage.transpose_shape(shape))


def _kind(quantizer: Any) -> str:
    if quantizer is None:
        raise RuntimeError("NoneQuantizer does not support quantization")
    for kind in ("Float8CurrentScalingQuantizer", "Float8Quantizer", *block_storage.BLOCK_KINDS):
        if isinstance(quantizer, te_class(kind)):
            return kind
    refuse(f"tex quantization with {type(quantizer).__name__}")


def compute_scale_from_amax(amax: float, fp8_max: float, force_pow_2: bool, epsilon: float,
                            value_for_inf: float = FLOAT32_MAX) -> float:
    """common/recipe/recipe_common.cuh, in fp32."""
    amax = torch.tensor(amax, dtype=torch.float32, device=device.EMULATED)
    if amax < epsilon:
        amax = torch.tensor(epsilon, dtype=torch.float32, device=device.EMULATED)
    if torch.isinf(amax) or amax == 0 or torch.isnan(amax):
        return 1.0
    scale = torch.tensor(fp8_max, dtype=torch.float32, device=device.EMULATED) / amax
    if torch.isinf(scale):
        scale = torch.tensor(value_for_inf, dtype=torch.float32, device=device.EMULATED)
    if force_pow_2:
        scale = (scale.view(torch.int32) & int(0xFF800000 - (1 << 32))).view(torch.float32)
    return float(scale)


def _allocate(q: Any, shape: tuple[int, ...], fake_dtype: torch.dtype, ref: torch.Tensor) -> Any:
    """Float8Quantizer/Float8CurrentScalingQuantizer::create_tensor: buffers per usage, then the Python object."""
    non_tn = device.non_tn_fp8_gemm()
    with_data = q.rowwise_usage or non_tn
    with_transpose = q.columnwise_usage and not non_tn
    data = torch.empty(shape, dtype=torch.uint8, device=ref.device) if with_data else None
    transpose = torch.empty(block_storage.transpose_shape(shape), dtype=torch.uint8, device=ref.device) \
        if with_transpose else None
    if _kind(q) == "Float8Quantizer":
        scale_inv = torch.reciprocal(q.scale).reshape(1).to(torch.float32)
    else:
        scale_inv = torch.empty(1, dtype=torch.float32, device=ref.device)
    kwargs = dict(data=data, fp8_scale_inv=scale_inv, fp8_dtype=q.dtype, data_transpose=transpose, quantizer=q)
    if q.internal:
        return te_class("Float8TensorStorage")(fake_dtype=fake_dtype, **kwargs)
    return te_class("Float8Tensor")(shape=shape, dtype=fake_dtype, device=ref.device, **kwargs)


def _coerce(q: Any, out: Any) -> None:
    """convert_and_update_tensor: drop or add the rowwise/transposed buffers the usages call for."""
    if not isinstance(out, te_class("Float8TensorStorage")):
        raise RuntimeError(f"{type(q).__name__} must output to Float8Tensor.")
    non_tn = device.non_tn_fp8_gemm()
    need_data, need_transpose = q.rowwise_usage or non_tn, q.columnwise_usage and not non_tn
    if out._data is None and out._transpose is None:
        raise RuntimeError("Float8Tensor has no data.")
    ref = out._data if out._data is not None else out._transpose
    shape = tuple(ref.shape) if out._data is not None else block_storage.untranspose_shape(tuple(ref.shape))
    if need_data != (out._data is not None):
        out._data = torch.empty(shape, dtype=torch.uint8, device=ref.device) if need_data else None
    if need_transpose != (out._transpose is not None):
        out._transpose = torch.empty(block_storage.transpose_shape(shape), dtype=torch.uint8, device=ref.device) \
            if need_transpose else None
    out._transpose_invalid = not need_transpose
    out._fp8_dtype = q.dtype


def _cast_into(out: Any, x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
    if out._data is not None:
        write(out._data, fp8.quantize(x, scale, dtype).view(torch.uint8))
    if out._transpose is not None:
        write(out._transpose, fp8.quantize(_transposed(x), scale, dtype).view(torch.uint8))


def amax_of(x: torch.Tensor) -> torch.Tensor:
    """max |x| as TE's kernels take it: fmaxf skips NaN elements (an inf stays inf)."""
    return x.detach().abs().float().nan_to_num(nan=0.0, posinf=float("inf")).max()


def current_scale(q: Any, amax: torch.Tensor) -> torch.Tensor:
    """A current-scaling quantizer's scale for `amax` (fp32, 0-d). nvte_compute_scale_from_amax passes fp32's max for
    an infinite scale, whatever the input dtype."""
    fp8_max = fp8.FP8_MAX[fp8_torch_dtype(q.dtype)]
    return torch.tensor(compute_scale_from_amax(float(amax), fp8_max, q.force_pow_2_scales, q.amax_epsilon),
                        dtype=torch.float32, device=device.EMULATED)


def noop(noop_flag: torch.Tensor | None) -> bool:
    """TE's no-op flag set: the kernel skips its work (skip_fp8_weight_update)."""
    return noop_flag is not None and bool(noop_flag.reshape(-1)[0] == 1)


def _quantize_into(q: Any, x: torch.Tensor, out: Any, given_amax: torch.Tensor | None = None) -> None:
    if x.numel() == 0:
        return
    dtype = fp8_torch_dtype(q.dtype)
    amax = amax_of(x) if given_amax is None else given_amax.float().reshape(())
    if _kind(q) == "Float8Quantizer":  # delayed scaling: the current scale, amax into the history slot
        write(q.amax, torch.maximum(q.amax, amax.reshape(q.amax.shape).to(q.amax.dtype)))
        scale = q.scale.float().reshape(())
    else:
        if q.with_amax_reduction:
            refuse("Float8CurrentScalingQuantizer amax reduction across ranks")
        scale = current_scale(q, amax)
    write(out._scale_inv, torch.reciprocal(scale).reshape(out._scale_inv.shape))
    _cast_into(out, x, scale, dtype)


def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop_flag: torch.Tensor | None = None) -> Any:
    """tex.quantize: into a new Float8Tensor, or into `output` (reshaped to the usages)."""
    src = tensor.contiguous()
    kind = _kind(quantizer)
    if kind in block_storage.BLOCK_KINDS:
        return block_quantize.quantize(kind, quantizer, src, output, noop_flag)
    if output is None:
        output = _allocate(quantizer, tuple(src.shape), src.dtype, src)
    else:
        _coerce(quantizer, output)
    if noop(noop_flag):
        return output
    _quantize_into(quantizer, src, output)
    return output


def quantize_with_amax(tensor: torch.Tensor, quantizer: Any, amax: torch.Tensor) -> Any:
    """quantizer.cpp's quantize_with_amax (current scaling, NVFP4): `tensor` cast under the per-tensor amax its
    producer computed (an activation kernel's, over its fp32 values), not one taken from `tensor` itself."""
    src, kind = tensor.contiguous(), _kind(quantizer)
    if kind == "NVFP4Quantizer":
        return block_quantize.quantize(kind, quantizer, src, None, None, amax)
    if kind != "Float8CurrentScalingQuantizer":
        raise RuntimeError(f"quantize_with_amax is not defined for {type(quantizer).__name__}")
    output = _allocate(quantizer, tuple(src.shape), src.dtype, src)
    _quantize_into(quantizer, src, output, amax)
    return output


def create_empty_quantized_tensor(quantizer: Any, shape: list[int], dtype: torch.dtype, device: torch.device,
                                  pin_memory: bool) -> Any:
    """tex.create_empty_quantized_tensor (cast.cpp): the quantizer's create_tensor, buffers uninitialised."""
    if pin_memory:
        refuse("pinned host memory for a quantized tensor")
    kind, ref = _kind(quantizer), torch.empty(0, device=device)
    if kind in block_storage.BLOCK_KINDS:
        return block_storage.allocate(kind, quantizer, tuple(shape), dtype, ref)
    return _allocate(quantizer, tuple(shape), dtype, ref)


def split_quantize(tensor: torch.Tensor, split_sections: list[int], quantizer_list: list,
                   disable_bulk_allocation: bool = False) -> list[Any]:
    """tex.split_quantize: dim-0 chunks of `tensor`, each quantized by its quantizer (the per-tensor FP8 path of
    csrc/extensions/cast.cpp allocates and quantizes them one by one)."""
    if len(quantizer_list) != len(split_sections):
        raise RuntimeError(f"Expected {len(split_sections)} quantizers, but got {len(quantizer_list)}")
    src = tensor.contiguous()
    if sum(split_sections) > src.shape[0]:
        raise RuntimeError(f"Attempted to split tensor with shape={list(src.shape)} along dim 0 with "
                           f"split_sections={list(split_sections)}")
    return [quantize(chunk, q) for chunk, q in zip(torch.split(src, list(split_sections)), quantizer_list)]


def dequantize(input: Any, otype: Any) -> torch.Tensor:
    """tex.dequantize of a quantized tensor to the dtype `otype`."""
    if block_quantize.kind_of(input) is not None:
        return block_quantize.dequantize(input, device.torch_dtype(otype))
    if not isinstance(input, te_class("Float8TensorStorage")):
        refuse(f"tex.dequantize of {type(input).__name__}")
    if input._data is not None:
        data = input._data
    elif input._transpose is not None and not input._transpose_invalid:
        t = input._transpose
        shape = block_storage.untranspose_shape(tuple(t.shape))
        data = t.reshape(block_storage.dims2(shape)[::-1]).t().reshape(shape)
    else:
        raise RuntimeError("Float8Tensor has no data.")
    # One scale for the tensor, as a 0-D factor: a 0-D tensor's values keep its shape [], not the scale's [1].
    values = fp8.dequantize(data.view(fp8_torch_dtype(input._fp8_dtype)), input._scale_inv.float().reshape(()))
    return values.to(device.torch_dtype(otype))


def bgrad_quantize(grad_output: torch.Tensor, quantizer: Any) -> list[Any]:
    """tex.bgrad_quantize: [bias gradient (sum over rows, in grad_output's dtype), quantized grad_output]."""
    g = grad_output.contiguous()
    grad_bias = g.reshape(-1, g.shape[-1]).sum(0) if g.numel() else torch.zeros(g.shape[-1], dtype=g.dtype, device=g.device)
    if quantizer is None:
        return [grad_bias.to(g.dtype), g]
    return [grad_bias.to(g.dtype), quantize(g, quantizer)]


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer: torch.Tensor, amax_histories: list,
                                                scales: list, amax_compute_algo: str, fp8_dtype: Any,
                                                margin: float) -> None:
    """common/recipe/delayed_scaling.cu kernel_bulk: per scale slot, roll the history (only when a new amax
    arrived), pick the amax (max of the rolled window or the most recent), scale = scaled_max / amax."""
    if amax_compute_algo not in ("max", "most_recent"):
        raise RuntimeError(f"Unsupported amax compute algorithm ({amax_compute_algo})")
    scaled_max = torch.tensor(fp8.FP8_MAX[fp8_torch_dtype(fp8_dtype)], dtype=torch.float32, device=device.EMULATED) \
        * torch.tensor(math.pow(2.0, -margin), dtype=torch.float32, device=device.EMULATED)
    offset = 0
    for history, scale in zip(amax_histories, scales):
        for slot in range(history.shape[1]):
            _update_slot(history[:, slot], scale.reshape(-1), slot, amax_reduction_buffer, offset + slot,
                         amax_compute_algo, scaled_max)
        offset += history.shape[1]


def _update_slot(history: torch.Tensor, scale: torch.Tensor, slot: int, reduced: torch.Tensor, index: int,
                 algo: str, scaled_max: torch.Tensor) -> None:
    new = reduced.reshape(-1)[index] if reduced is not None and reduced.numel() > index else torch.tensor(0.0, device=device.EMULATED)
    last = new if new != 0 else history[0].clone()
    amax = torch.tensor(0.0, device=device.EMULATED)
    if last != 0:
        window = torch.cat([history[1:], last.reshape(1)])
        amax = window.nan_to_num(nan=0.0, posinf=float("inf")).max()  # fmaxf skips NaN
        write(history, torch.cat([torch.zeros(1, device=device.EMULATED), window[1:]]))
    if algo == "most_recent":
        amax = last
    if torch.isfinite(amax) and amax > 0:
        value = scaled_max / amax
    else:
        value = scale[slot].clone()
    if torch.isinf(value):
        value = torch.tensor(FLOAT32_MAX, device=device.EMULATED)
    write(scale[slot], value)
