"""tex's activation functions in PyTorch: gelu, relu, srelu, qgelu, silu, their gated (GLU) forms and their
gradients, and the fused bias-gradient forms dbias_d<act> (LayerNormMLP, te.ops activations).

Semantics follow TE's C++, main of 2026-08-22 (d0067d0): the formulas of common/util/math.h, computed in fp32 as
the kernels do (`const float cval = val`), e.g. gelu(x) = x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 x^2)))
and dgelu(x) = 0.5 x (1 - t^2)(0.79788456 + 0.1070322243 x^2) + 0.5 (1 + t), t = tanh(0.79788456 x (1 + 0.044715
x^2)) (TE's tanh approximation, not erf); relu/drelu, srelu = x^2 for x > 0 and dsrelu = max(2x, 0); qgelu = x
sigmoid(1.702 x); silu = x sigmoid(x). d<act>(grad, x) = grad * act'(x). Gated forms (csrc activation_helper with
shape_divisor 2; common/cast/fp8/gated_fp8.cuh): the input's last dim is [a | g], out = act(a) * g, and the
gradient is [grad * act'(a) * g | grad * act(a)]. Output dtypes as activation.cpp: the input's (d<act>: the
activation input's), dbias_d<act>: grad_output's, dbias its sum over rows: of the fp32 gradient values with a
delayed-scaling or MXFP8 quantizer (the fused kernels' fp32 partial sums), else of the values rounded to
grad_output's dtype (bias.cpp's at::sum_out over its high-precision temporary).
Quantized outputs as activation.cpp and bias.cpp pick the path per quantizer (delayed scaling, current scaling,
MXFP8, FP8 block scaling, NVFP4 with its options): activation_output.py. Gated MXFP8 needs sm100 and a half width
divisible by 32 (dispatch/gated.cuh).
Clamped SwiGLU (GPT-OSS; math.h clamped_silu/clamped_dsilu, the gated kernels' ClampedSwiGLUParam branch):
a_c = min(a, limit), act = a_c sigmoid(alpha a_c); gate = clamp(g, -limit, limit) + glu_linear_offset; out = act *
gate. Its gradient is [grad act'(a_c) gate | grad act], act' zero where a > limit and the gate's zero outside
[-limit, limit] (both bounds kept: the kernels' `<=`). The parameters are fp32 (pybind's float, defaults 7.0, 1.702,
1.0); min/max return the number for a NaN operand as CUDA's fminf/fmaxf do.
SiTU-GLU (math.h situ_gate/situ_up and their derivatives, the gated kernels' SiTUGLUParam branch): act(a) = beta1
tanh(a / beta1) sigmoid(a), gate = beta2 tanh(g / beta2), out = act * gate; the gradient [(act'(a) grad) gate |
(gate'(g) grad) act], act' = (1 - t^2) sigmoid(a) + beta1 t sigmoid(a) (1 - sigmoid(a)) with t = tanh(a / beta1),
gate' = 1 - tanh(g / beta2)^2; beta1 and beta2 fp32 (pybind's defaults 4.0 and 25.0).
The scaled activations are scaled_activation.py's. Refused (Unemulated): other quantizers, the grouped activations
(group_scaled_*), and what `quantize` refuses.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from te_verify.te.tecpu import activation_output, device
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.te_classes import te_class

GELU_K0, GELU_K1 = 0.79788456, 0.03567741  # gelu: sqrt(2/pi) and sqrt(2/pi) * 0.044715, as math.h writes them
DGELU_K1, DGELU_K2 = 0.044715, 0.1070322243  # dgelu: the cubic's coefficient and 3 * sqrt(2/pi) * 0.044715
QGELU_ALPHA = 1.702


def fp32(x: float) -> torch.Tensor:
    """A constant as the kernel holds it: an fp32 literal."""
    return torch.tensor(x, dtype=torch.float32)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return x * (0.5 + 0.5 * torch.tanh(x * (fp32(GELU_K0) + fp32(GELU_K1) * x * x)))


def _dgelu(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(fp32(GELU_K0) * x * (1.0 + fp32(DGELU_K1) * x * x))
    return 0.5 * x * ((1.0 - t * t) * (fp32(GELU_K0) + fp32(DGELU_K2) * x * x)) + 0.5 * (1.0 + t)


def _dsigmoid(x: torch.Tensor) -> torch.Tensor:
    s = _sigmoid(x)
    return s * (1.0 - s)


def _qgelu(x: torch.Tensor, alpha: float = QGELU_ALPHA) -> torch.Tensor:
    return x * _sigmoid(fp32(alpha) * x)


def _dqgelu(x: torch.Tensor, alpha: float = QGELU_ALPHA) -> torch.Tensor:
    ax = fp32(alpha) * x
    return ax * _dsigmoid(ax) + _sigmoid(ax)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * _sigmoid(x)


def _dsilu(x: torch.Tensor) -> torch.Tensor:
    return x * _dsigmoid(x) + _sigmoid(x)


# name -> (act, act') on fp32 values (math.h).
FORMULAS: dict[str, tuple[Callable, Callable]] = {
    "gelu": (_gelu, _dgelu),
    "relu": (lambda x: torch.clamp_min(x, 0.0), lambda x: (x > 0).float()),
    "srelu": (lambda x: torch.where(x > 0, x * x, 0.0), lambda x: torch.clamp_min(2.0 * x, 0.0)),
    "qgelu": (_qgelu, _dqgelu),
    "silu": (_silu, _dsilu),
    "sigmoid": (_sigmoid, _dsigmoid),  # glu's activation
}
# tex's gated names -> the activation of their first half.
GATED = {"geglu": "gelu", "reglu": "relu", "sreglu": "srelu", "qgeglu": "qgelu", "swiglu": "silu", "glu": "sigmoid"}


def _check_gated_mxfp8(quantizer: Any, half_width: int, direction: str) -> None:
    """dispatch/gated.cuh's checks before the gated MXFP8 kernel."""
    if activation_output.kind_of(quantizer) != "MXFP8Quantizer":
        return
    if half_width % 32:
        raise RuntimeError(f"Invalid input shape. Expected the last dimension to be divisible by 32, but got "
                           f"{half_width}.")
    if device.sm_arch() < 100:
        raise RuntimeError(f"Gated {direction} NVTE_MXFP8_1D_SCALING is only supported on SM 10.0+")


def _values(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or isinstance(t, te_class("QuantizedTensorStorage")):
        refuse(f"an activation of a {type(t).__name__} input")
    return t.contiguous().float()


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() < 1 or x.shape[-1] % 2:
        raise RuntimeError(f"gated activation input's last dim must be even, got {list(x.shape)}")
    return x.chunk(2, dim=-1)


def activation(name: str) -> Callable:
    """tex.<name>(input, quantizer) for a plain or gated activation."""
    gated = name in GATED
    act = FORMULAS[GATED.get(name, name)][0]

    def forward(input: torch.Tensor, quantizer: Any) -> Any:
        activation_output.kind_of(quantizer)
        x = _values(input)
        if gated:
            a, g = _halves(x)
            _check_gated_mxfp8(quantizer, a.shape[-1], "FWD")
            y = act(a) * g
        else:
            y = act(x)
        return activation_output.write(y, quantizer, input.dtype)

    forward.__name__ = name
    return forward


def _grad(name: str, grad: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """The fp32 gradient values of d<name>(grad, input)."""
    gated = name in GATED
    act, dact = FORMULAS[GATED.get(name, name)]
    x, dy = _values(input), _values(grad)
    if not gated:
        if dy.shape != x.shape:
            raise RuntimeError(f"d{name}: grad {list(dy.shape)} and input {list(x.shape)} differ")
        return dy * dact(x)
    a, g = _halves(x)
    if dy.shape != a.shape:
        raise RuntimeError(f"d{name}: grad {list(dy.shape)} is not half of input {list(x.shape)}")
    return torch.cat([dy * dact(a) * g, dy * act(a)], dim=-1)


def dactivation(name: str) -> Callable:
    """tex.d<name>(grad, input, quantizer): the input's gradient, in the input's dtype."""
    def backward(grad: torch.Tensor, input: torch.Tensor, quantizer: Any) -> Any:
        activation_output.kind_of(quantizer)
        dx = _grad(name, grad, input)
        if name in GATED:
            _check_gated_mxfp8(quantizer, dx.shape[-1] // 2, "BWD")
        return activation_output.write(dx, quantizer, input.dtype)

    backward.__name__ = f"d{name}"
    return backward


def dbias_dactivation(name: str) -> Callable:
    """tex.dbias_d<name>(grad_output, act_input, quantizer) -> [dbias, grad_input], both in grad_output's dtype."""
    def backward(grad_output: torch.Tensor, act_input: torch.Tensor, quantizer: Any) -> list[Any]:
        dx = _grad(name, grad_output, act_input)
        summed = dx if activation_output.sums_fp32(quantizer) else dx.to(grad_output.dtype).float()
        dbias = summed.reshape(-1, dx.shape[-1]).sum(0).to(grad_output.dtype)
        return [dbias, activation_output.write(dx, quantizer, grad_output.dtype)]

    backward.__name__ = f"dbias_d{name}"
    return backward


def _param_forward(halves: Callable, input: torch.Tensor, quantizer: Any, *params: float) -> Any:
    """A parametrised gated activation: act(a) * gate over [a | g], `halves` giving (act, act', gate, gate')."""
    activation_output.kind_of(quantizer)
    act, _, gate, _ = halves(_values(input), *params)
    _check_gated_mxfp8(quantizer, act.shape[-1], "FWD")
    return activation_output.write(act * gate, quantizer, input.dtype)


def _param_backward(name: str, halves: Callable, grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any,
                    *params: float) -> Any:
    """Its gradient [(act' grad) gate | (gate' grad) act], in the input's dtype or quantized."""
    activation_output.kind_of(quantizer)
    act, dact, gate, dgate = halves(_values(fwd_input), *params)
    dy = _values(grad)
    if dy.shape != act.shape:
        raise RuntimeError(f"{name}: grad {list(dy.shape)} is not half of input {list(fwd_input.shape)}")
    _check_gated_mxfp8(quantizer, act.shape[-1], "BWD")
    # The kernels' products in their order: (act' * grad) * gate, (gate' * grad) * act.
    return activation_output.write(torch.cat([dact * dy * gate, dgate * dy * act], dim=-1), quantizer,
                                   fwd_input.dtype)


def _clamped_halves(x: torch.Tensor, limit: float, alpha: float, offset: float) -> tuple[torch.Tensor, ...]:
    """fp32 [a | g] -> (act(a), act'(a), gate, gate'): clamped SwiGLU's two halves and their derivatives."""
    a, g = _halves(x)
    lim = fp32(limit)
    a_c = torch.fmin(a, lim)
    act, dact = _qgelu(a_c, alpha), torch.where(a <= lim, _dqgelu(a_c, alpha), 0.0)
    gate = torch.fmin(torch.fmax(g, -lim), lim) + fp32(offset)
    return act, dact, gate, ((g >= -lim) & (g <= lim)).float()


def clamped_swiglu(input: torch.Tensor, quantizer: Any, limit: float = 7.0, alpha: float = 1.702,
                   glu_linear_offset: float = 1.0) -> Any:
    """tex.clamped_swiglu (pybind.cpp's argument names and defaults; module docstring)."""
    return _param_forward(_clamped_halves, input, quantizer, limit, alpha, glu_linear_offset)


def clamped_dswiglu(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any, limit: float = 7.0,
                    alpha: float = 1.702, glu_linear_offset: float = 1.0) -> Any:
    """tex.clamped_dswiglu."""
    return _param_backward("clamped_dswiglu", _clamped_halves, grad, fwd_input, quantizer, limit, alpha,
                           glu_linear_offset)


def _situ_halves(x: torch.Tensor, beta1: float, beta2: float) -> tuple[torch.Tensor, ...]:
    """fp32 [a | g] -> (act(a), act'(a), gate, gate'): SiTU-GLU's two halves and their derivatives (math.h)."""
    return situ_of(*_halves(x), beta1, beta2)


def situ_of(a: torch.Tensor, g: torch.Tensor, beta1: float, beta2: float) -> tuple[torch.Tensor, ...]:
    """_situ_halves over a and g already apart (the scaled activations' interleaved layouts split them)."""
    b1, b2 = fp32(beta1), fp32(beta2)
    t, s, u = torch.tanh(a / b1), _sigmoid(a), torch.tanh(g / b2)
    return b1 * t * s, (1.0 - t * t) * s + b1 * t * s * (1.0 - s), b2 * u, 1.0 - u * u


def situglu(input: torch.Tensor, quantizer: Any, beta1: float = 4.0, beta2: float = 25.0) -> Any:
    """tex.situglu (pybind.cpp's argument names and defaults; module docstring)."""
    return _param_forward(_situ_halves, input, quantizer, beta1, beta2)


def dsituglu(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any, beta1: float = 4.0,
             beta2: float = 25.0) -> Any:
    """tex.dsituglu."""
    return _param_backward("dsituglu", _situ_halves, grad, fwd_input, quantizer, beta1, beta2)


def functions() -> dict[str, Callable]:
    """Every tex activation function emulated, by tex name."""
    plain = [n for n in FORMULAS if n != "sigmoid"]
    out: dict[str, Callable] = {}
    for name in [*plain, *GATED]:
        out[name], out[f"d{name}"] = activation(name), dactivation(name)
    out.update({f"dbias_d{name}": dbias_dactivation(name) for name in plain})
    out.update(clamped_swiglu=clamped_swiglu, clamped_dswiglu=clamped_dswiglu, situglu=situglu, dsituglu=dsituglu)
    return out
