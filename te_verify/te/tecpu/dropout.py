"""tex.dropout_fwd / dropout_bwd (te.ops Dropout's fused path: training, FP16/BF16, numel a multiple of 16) as
common/dropout/dropout.cu and csrc/extensions/dropout.cpp compute them, main d0067d0.

An element is dropped when its random byte is below floor(256 p) (`bytewise_less_than` against the byte-quantized
probability, so the drop rate is a multiple of 1/256); kept values are x * scale in fp32, scale = 1 / (1 - p) in fp32
(the host's float arithmetic), then cast to the output dtype; dropped ones are 0. The mask holds one bit per element,
1 = kept: the kernel's uint16 chunk of 16 elements holds element i at bit i, so byte b bit k is element 8 b + k.
A tensor-scaled Float8Tensor input is dequantized by its scale_inv first and yields its nominal dtype. The random
bytes are the emulated device's (block_quantize.random_bytes), not the GPU's Philox stream: the same law, not the
same draws.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te import fp8
from te_verify.te.tecpu import block_quantize, quantize
from te_verify.te.tecpu.te_classes import te_class
from te_verify.te.tecpu.writes import write

HALF = (torch.float16, torch.bfloat16)
BIT_WEIGHTS = 1 << torch.arange(8, dtype=torch.int32)


def _scale(p: float) -> torch.Tensor:
    """dropout.cu's `1 / (1 - dropout_probability)` on pybind's float."""
    if not 0 <= p < 1:
        raise RuntimeError(f"Invalid dropout probability ({p}).")
    p32 = torch.tensor(p, dtype=torch.float32)
    return torch.tensor(1.0, dtype=torch.float32) / (1 - p32)


def _check_numel(numel: int, what: str) -> None:
    if numel % 16:
        raise RuntimeError(f"{what} number of elements must be divisible by 16, but has {numel}.")


def _values(input: Any) -> tuple[torch.Tensor, torch.dtype]:
    """(fp32 values, output dtype) of an FP16/BF16 tensor or a tensor-scaled FP8 one."""
    if isinstance(input, te_class("Float8TensorStorage")):
        if input._data is None:
            raise RuntimeError("Input tensor is missing data.")
        data = input._data.view(quantize.fp8_torch_dtype(input._fp8_dtype))
        return fp8.dequantize(data, input._scale_inv.float().reshape(())), input.dtype
    if isinstance(input, te_class("QuantizedTensorStorage")) or input.dtype not in HALF:
        raise RuntimeError(f"Input tensor must be FP16/BF16 tensor or tensor-scaled FP8 tensor, but is "
                           f"{type(input).__name__} of {getattr(input, 'dtype', None)}.")
    return input.float(), input.dtype


def pack(kept: torch.Tensor) -> torch.Tensor:
    """One bit per element, byte b bit k for element 8 b + k."""
    bits = kept.reshape(-1, 8).to(torch.int32) * BIT_WEIGHTS
    return bits.sum(-1).to(torch.uint8)


def unpack(mask: torch.Tensor) -> torch.Tensor:
    """The kept elements (bool) of a mask made by pack."""
    return ((mask.reshape(-1, 1).to(torch.int32) & BIT_WEIGHTS) != 0).reshape(-1)


def _apply(values: torch.Tensor, kept: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(kept.reshape(values.shape), values, 0.0).mul(scale).to(dtype)


def dropout_fwd(input: Any, dropout_probability: float, out: torch.Tensor | None = None) -> list[torch.Tensor]:
    """tex.dropout_fwd -> [out, mask]."""
    values, dtype = _values(input)
    _check_numel(values.numel(), "Input tensor")
    scale = _scale(dropout_probability)
    threshold = int(torch.floor(torch.tensor(dropout_probability, dtype=torch.float32) * 256))
    kept = block_quantize.random_bytes((values.numel(),)).to(torch.int32) >= threshold
    result = _apply(values, kept, scale, dtype)
    if out is None:
        return [result, pack(kept)]
    if out.dtype not in HALF or out.numel() != values.numel():
        raise RuntimeError(f"Output tensor must be an FP16/BF16 tensor of {values.numel()} elements, got "
                           f"{out.dtype} {list(out.shape)}.")
    write(out, result.reshape(out.shape).to(out.dtype))
    return [out, pack(kept)]


def dropout_bwd(grad_output: torch.Tensor, mask: torch.Tensor, dropout_probability: float,
                grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """tex.dropout_bwd: grad_output through the forward's mask and scale, in its dtype."""
    if grad_output.dtype not in HALF:
        raise RuntimeError(f"Grad output tensor must be FP16/BF16 tensor, but dtype is {grad_output.dtype}.")
    _check_numel(grad_output.numel(), "Grad output tensor")
    if mask.numel() * mask.element_size() * 8 != grad_output.numel():
        raise RuntimeError(f"Mask tensor must have {grad_output.numel()} bits, but has {mask.numel()} "
                           f"{mask.dtype} elements.")
    result = _apply(grad_output.float(), unpack(mask.view(torch.uint8)), _scale(dropout_probability),
                    grad_output.dtype)
    if grad_input is None:
        return result
    return write(grad_input, result.reshape(grad_input.shape))
