"""tex's scaled activations (te.ops ScaledSwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU; GroupedMLP's
scaled SwiGLU) as csrc/extensions/activation.cpp and common/activation/scaled_activation.cu compute them, main
d0067d0.

The input is read as rows; act_scales holds one scale per row. Gated forms read each row as [a | g], or with
glu_interleave_size s > 0 (a multiple of 32) as segments [a(s) | g(s)] repeated. Forward, in fp32 per element:
unscaled = act(a) * gate(g), out = unscaled * scale[row] in the input's dtype, then quantized by the quantizer if one
is given (activation.cpp's maybe_quantize: unfused). Backward: with g' = grad * scale[row], grad_input = [g' (act'(a)
gate) | g' (act(a) gate')] in the input's dtype (unary: (grad * scale) act'(x)), and grad_scales[row] = the row's sum
of grad * unscaled, in act_scales' dtype (None without compute_scale_grad). The kernels' per-element products in their
order (scaled_activation.cu's gated_backward_values: SiLU and clamped SiLU from one sigmoid); the row sum is torch's
fp32 sum, not the kernel's block reduction order (within fp32 summation's bound).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from te_verify.te.tecpu import activation, quantize
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class

Halves = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # act(a), act'(a), gate(g), gate'(g)


def _swiglu(a: torch.Tensor, g: torch.Tensor) -> Halves:
    s = activation._sigmoid(a)
    return a * s, s + a * s * (1.0 - s), g, torch.ones_like(g)


def _clamped(limit: float, alpha: float, offset: float) -> Callable[[torch.Tensor, torch.Tensor], Halves]:
    # Not activation._clamped_halves: scaled_activation.cu's fused derivative s + alpha x s (1 - s) rounds otherwise
    # than math.h's clamped_dsilu (alpha x dsigmoid(alpha x) + sigmoid(alpha x)), which the plain kernel uses.
    lim, al = activation.fp32(limit), activation.fp32(alpha)

    def halves(a: torch.Tensor, g: torch.Tensor) -> Halves:
        x = torch.fmin(a, lim)
        s = activation._sigmoid(al * x)
        dact = torch.where(a <= lim, s + al * x * s * (1.0 - s), 0.0)
        gate = torch.fmin(torch.fmax(g, -lim), lim) + activation.fp32(offset)
        return x * s, dact, gate, ((g <= lim) & (g >= -lim)).float()

    return halves


def _situ(beta1: float, beta2: float) -> Callable[[torch.Tensor, torch.Tensor], Halves]:
    def halves(a: torch.Tensor, g: torch.Tensor) -> Halves:
        return activation.situ_of(a, g, beta1, beta2)

    return halves


def _rows(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or isinstance(t, te_class("QuantizedTensorStorage")):
        refuse(f"a scaled activation of a {type(t).__name__} {what}")
    if t.dim() < 1:
        raise RuntimeError(f"scaled activation {what} must have at least 1 dimension")
    return t.contiguous().float().reshape(-1, t.shape[-1])


def _scales(act_scales: torch.Tensor, rows: int) -> torch.Tensor:
    scales = act_scales.contiguous().float().reshape(-1)
    if scales.numel() != rows:
        raise RuntimeError("scaled activation expects one scale per input row")
    return scales[:, None]


def _split(x: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, 2H] -> (a, g), each [rows, H], plain or in segments of s."""
    half = x.shape[-1] // 2
    if x.shape[-1] % 2:
        raise RuntimeError("scaled activation input width is not compatible with activation")
    if s < 0 or (s and (s % 32 or half % s)):
        raise RuntimeError(f"glu_interleave_size {s}: must be 0 or a multiple of 32 dividing {half}")
    if not s:
        return x[:, :half], x[:, half:]
    seg = x.reshape(x.shape[0], half // s, 2, s)
    return seg[:, :, 0].reshape(-1, half), seg[:, :, 1].reshape(-1, half)


def _join(da: torch.Tensor, dg: torch.Tensor, s: int) -> torch.Tensor:
    if not s:
        return torch.cat([da, dg], -1)
    rows, half = da.shape
    return torch.stack([da.reshape(rows, half // s, s), dg.reshape(rows, half // s, s)], 2).reshape(rows, 2 * half)


def _out(values: torch.Tensor, shape: list[int], dtype: torch.dtype, quantizer: Any) -> Any:
    out = values.reshape(shape).to(dtype)
    return out if quantizer is None else quantize.quantize(out, quantizer)


def _gated_forward(halves: Callable, input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any,
                   s: int) -> Any:
    x = _rows(input, "input")
    act, _, gate, _ = halves(*_split(x, int(s)))
    shape = [*input.shape[:-1], input.shape[-1] // 2]
    return _out(act * gate * _scales(act_scales, x.shape[0]), shape, input.dtype, quantizer)


def _gated_backward(halves: Callable, grad: torch.Tensor, input: torch.Tensor, act_scales: torch.Tensor,
                    quantizer: Any, s: int, compute_scale_grad: bool) -> tuple[Any, torch.Tensor | None]:
    x, dy = _rows(input, "input"), _rows(grad, "grad")
    if dy.shape != (x.shape[0], x.shape[1] // 2):
        raise RuntimeError(f"scaled dactivation: grad {list(grad.shape)} is not half of input {list(input.shape)}")
    act, dact, gate, dgate = halves(*_split(x, int(s)))
    scaled = dy * _scales(act_scales, x.shape[0])
    dx = _join(scaled * (dact * gate), scaled * (act * dgate), int(s))
    return _out(dx, list(input.shape), input.dtype, quantizer), _scale_grad(dy * (act * gate), act_scales,
                                                                           compute_scale_grad)


def _scale_grad(products: torch.Tensor, act_scales: torch.Tensor, compute: bool) -> torch.Tensor | None:
    return products.sum(-1).reshape(act_scales.shape).to(act_scales.dtype) if compute else None


def scaled_swiglu(input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any, glu_interleave_size: int = 0) -> Any:
    return _gated_forward(_swiglu, input, act_scales, quantizer, glu_interleave_size)


def scaled_dswiglu(grad: torch.Tensor, input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any,
                   glu_interleave_size: int = 0, compute_scale_grad: bool = True) -> tuple:
    return _gated_backward(_swiglu, grad, input, act_scales, quantizer, glu_interleave_size, compute_scale_grad)


def scaled_clamped_swiglu(input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any, limit: float = 7.0,
                          alpha: float = 1.702, glu_linear_offset: float = 1.0, glu_interleave_size: int = 0) -> Any:
    return _gated_forward(_clamped(limit, alpha, glu_linear_offset), input, act_scales, quantizer,
                          glu_interleave_size)


def scaled_clamped_dswiglu(grad: torch.Tensor, input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any,
                           limit: float = 7.0, alpha: float = 1.702, glu_linear_offset: float = 1.0,
                           glu_interleave_size: int = 0, compute_scale_grad: bool = True) -> tuple:
    return _gated_backward(_clamped(limit, alpha, glu_linear_offset), grad, input, act_scales, quantizer,
                           glu_interleave_size, compute_scale_grad)


def scaled_situglu(input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any, beta1: float = 4.0,
                   beta2: float = 25.0, glu_interleave_size: int = 0) -> Any:
    return _gated_forward(_situ(beta1, beta2), input, act_scales, quantizer, glu_interleave_size)


def scaled_dsituglu(grad: torch.Tensor, input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any,
                    beta1: float = 4.0, beta2: float = 25.0, glu_interleave_size: int = 0,
                    compute_scale_grad: bool = True) -> tuple:
    return _gated_backward(_situ(beta1, beta2), grad, input, act_scales, quantizer, glu_interleave_size,
                           compute_scale_grad)


def scaled_srelu(input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any) -> Any:
    x = _rows(input, "input")
    act, _ = activation.FORMULAS["srelu"]
    return _out(act(x) * _scales(act_scales, x.shape[0]), list(input.shape), input.dtype, quantizer)


def scaled_dsrelu(grad: torch.Tensor, input: torch.Tensor, act_scales: torch.Tensor, quantizer: Any,
                  compute_scale_grad: bool = True) -> tuple:
    x, dy = _rows(input, "input"), _rows(grad, "grad")
    if dy.shape != x.shape:
        raise RuntimeError(f"scaled_dsrelu: grad {list(grad.shape)} and input {list(input.shape)} differ")
    act, dact = activation.FORMULAS["srelu"]
    dx = dy * _scales(act_scales, x.shape[0]) * dact(x)
    return _out(dx, list(input.shape), input.dtype, quantizer), _scale_grad(dy * act(x), act_scales,
                                                                           compute_scale_grad)


def functions() -> dict[str, Callable]:
    """Every scaled activation emulated, by tex name."""
    return {f.__name__: f for f in (scaled_swiglu, scaled_dswiglu, scaled_clamped_swiglu, scaled_clamped_dswiglu,
                                    scaled_situglu, scaled_dsituglu, scaled_srelu, scaled_dsrelu)}
