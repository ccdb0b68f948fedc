"""tex's normalization functions in PyTorch: layernorm_fwd/bwd, rmsnorm_fwd/bwd and rmsnorm_bwd_add (LayerNormLinear,
LayerNormMLP, te.ops LayerNorm/RMSNorm and te.ops' fused backward of RMSNorm behind MakeExtraOutput).

Semantics follow TE's C++ (csrc/extensions/normalization.cpp; common/normalization/{layernorm,rmsnorm}/*_kernels.cuh,
ln_api.cpp), main of 2026-08-22:
- The input is read as 2-D (outer, inner); every statistic and every output value is computed in fp32 (the
  kernels' compute_t): mu = mean(x), rsigma = 1 / sqrt(mean((x - mu)^2) + eps) (RMSNorm: mean(x^2)), gamma + 1 with
  zero_centered_gamma; mu and rsigma are fp32 vectors of `outer` (RMSNorm returns None for mu).
- Output: unquantized, y in `otype`. With a per-tensor delayed-scaling quantizer (Float8Quantizer) the kernel writes
  FP8 straight from fp32 (amax and the cast on the fp32 value, "fully fused"). With any other quantizer the value is
  rounded to `otype` first and quantized from there (current scaling and NVFP4 take their amax from the otype value:
  "amax on the value converted to output_t"; MXFP8 and FP8 block scaling quantize the unfused output). The FP8
  transposed copy, where the usage asks for one, is nvte_transpose of the rowwise data (ln_api.cpp).
- Backward, in fp32: xhat = (x - mu) * rsigma, dy = dz * gamma; dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))
  (RMSNorm without the mean(dy) term), dgamma = sum over rows of dz * xhat, dbeta = sum of dz; dx in x's dtype,
  dgamma and dbeta in gamma's. rmsnorm_bwd_add adds `add` to the fp32 dx before that rounding
  (rmsnorm_bwd_kernels.cuh, FusedAdd).
sm_margin only sets how many SMs the kernels use (no effect on values): accepted when it is a non-negative int.
Refused (Unemulated): a quantized input, a preallocated output (TE's Python passes None), cuDNN's normalization
backend (NVTE_NORM_FWD_USE_CUDNN / NVTE_NORM_BWD_USE_CUDNN: other kernels), and what `quantize` refuses.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from te_verify.te.tecpu import device, quantize
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class

CUDNN_SWITCHES = ("NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN")


def _check_call(x: Any, gamma: torch.Tensor, beta: torch.Tensor | None, eps: float, out: Any, sm_margin: int) -> None:
    """ln_api.cpp's NVTE_CHECKs, and what the emulation refuses."""
    if not isinstance(x, torch.Tensor) or isinstance(x, te_class("QuantizedTensorStorage")):
        refuse(f"normalization of a {type(x).__name__} input")
    if out is not None:
        refuse("normalization into a preallocated ln_out")
    for switch in CUDNN_SWITCHES:
        if os.environ.get(switch, "0") not in ("", "0"):
            refuse(f"cuDNN's normalization kernels ({switch})")
    if not isinstance(sm_margin, int) or sm_margin < 0:
        raise RuntimeError(f"sm_margin must be a non-negative int, got {sm_margin!r}")
    if eps < 0:
        raise RuntimeError("Epsilon must be non-negative.")
    if x.dim() < 1 or tuple(gamma.shape) != (x.shape[-1],):
        raise RuntimeError(f"Gamma must have the same hidden size: x {list(x.shape)}, gamma {list(gamma.shape)}.")
    if beta is not None and (beta.shape != gamma.shape or beta.dtype != gamma.dtype):
        raise RuntimeError("Gamma and Beta must have the same shape and dtype.")


def _gamma(gamma: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    g = gamma.float()
    return g + 1.0 if zero_centered_gamma else g


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().float().reshape(-1, x.shape[-1])


def kernel_output(y32: torch.Tensor, shape: torch.Size, quantizer: Any, dtype: torch.dtype) -> Any:
    """A normalization kernel's fp32 values as TE's Python receives them in `dtype` (see the module docstring; the
    activation kernels' rule differs: activation_output.py)."""
    y32 = y32.reshape(shape)
    if quantizer is None:
        return y32.to(dtype)
    if isinstance(quantizer, te_class("Float8Quantizer")):  # FULLY_FUSED: FP8 from the fp32 value
        out = quantize.create_empty_quantized_tensor(quantizer, list(shape), dtype, y32.device, False)
        return quantize.quantize(y32, quantizer, out)
    return quantize.quantize(y32.to(dtype), quantizer)


def layernorm_fwd(input: Any, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, ln_out: Any,
                  quantizer: Any, otype: Any, sm_margin: int, zero_centered_gamma: bool) -> list[Any]:
    """tex.layernorm_fwd -> [out, mu, rsigma]."""
    _check_call(input, weight, bias, eps, ln_out, sm_margin)
    x = _rows(input)
    mu = x.mean(-1)
    rsigma = torch.rsqrt((x - mu[:, None]).square().mean(-1) + eps)
    y = (x - mu[:, None]) * rsigma[:, None] * _gamma(weight, zero_centered_gamma)
    if bias is not None:
        y = y + bias.float()
    return [kernel_output(y, input.shape, quantizer, device.torch_dtype(otype)), mu, rsigma]


def rmsnorm_fwd(input: Any, weight: torch.Tensor, eps: float, ln_out: Any, quantizer: Any, otype: Any,
                sm_margin: int, zero_centered_gamma: bool) -> list[Any]:
    """tex.rmsnorm_fwd -> [out, None, rsigma]."""
    _check_call(input, weight, None, eps, ln_out, sm_margin)
    x = _rows(input)
    rsigma = torch.rsqrt(x.square().mean(-1) + eps)
    y = x * rsigma[:, None] * _gamma(weight, zero_centered_gamma)
    return [kernel_output(y, input.shape, quantizer, device.torch_dtype(otype)), None, rsigma]


def _backward(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor | None, rsigma: torch.Tensor, gamma: torch.Tensor,
              sm_margin: int, zero_centered_gamma: bool, add: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dgamma, dbeta) of LayerNorm (mu given) or RMSNorm (mu None), with TE's output dtypes; `add` joins dx
    in fp32, before its rounding to x's dtype (the kernels' FusedAdd)."""
    _check_call(x, gamma, None, 0.0, None, sm_margin)
    rows = _rows(x)
    centered = rows - mu.float()[:, None] if mu is not None else rows
    xhat = centered * rsigma.float()[:, None]
    dzf = _rows(dz)
    dy = dzf * _gamma(gamma, zero_centered_gamma)
    inner = dy - xhat * (dy * xhat).mean(-1, keepdim=True)
    if mu is not None:
        inner = inner - dy.mean(-1, keepdim=True)
    dx = rsigma.float()[:, None] * inner
    if add is not None:
        dx = dx + _rows(add)
    dx = dx.to(x.dtype).reshape(x.shape)
    return dx, (dzf * xhat).sum(0).to(gamma.dtype), dzf.sum(0).to(gamma.dtype)


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                  sm_margin: int, zero_centered_gamma: bool) -> list[torch.Tensor]:
    """tex.layernorm_bwd -> [dx, dgamma, dbeta]."""
    return list(_backward(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma))


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor, sm_margin: int,
                zero_centered_gamma: bool) -> list[torch.Tensor]:
    """tex.rmsnorm_bwd -> [dx, dgamma]."""
    dx, dgamma, _ = _backward(dz, x, None, rsigma, gamma, sm_margin, zero_centered_gamma)
    return [dx, dgamma]


def rmsnorm_bwd_add(dz: torch.Tensor, x: torch.Tensor, add: torch.Tensor, rsigma: torch.Tensor,
                    gamma: torch.Tensor, sm_margin: int, zero_centered_gamma: bool) -> list[torch.Tensor]:
    """tex.rmsnorm_bwd_add -> [dx, dgamma]: rmsnorm_bwd's, with `add` (another branch's gradient of x) added to
    the fp32 dx in the kernel (rmsnorm_api.cpp: `add` in gamma's dtype and x's shape)."""
    if add.dtype != gamma.dtype or add.shape != x.shape:
        raise RuntimeError(f"rmsnorm_bwd_add: add {add.dtype} {list(add.shape)} must have gamma's dtype "
                           f"{gamma.dtype} and x's shape {list(x.shape)}")
    dx, dgamma, _ = _backward(dz, x, None, rsigma, gamma, sm_margin, zero_centered_gamma, add)
    return [dx, dgamma]
