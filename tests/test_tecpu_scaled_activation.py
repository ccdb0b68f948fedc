"""tex's scaled activations (te_verify/te/tecpu/scaled_activation.py) and the grouped dbias/dscales triton wrapper
held to their definitions, written here in fp64:
- scaled_<act>(x, scales) = scales[row] * act(x) for srelu (x^2 for x > 0) and the gated swiglu (a sigmoid(a) g),
  clamped swiglu (a_c sigmoid(alpha a_c) (clamp(g, -limit, limit) + offset), a_c = min(a, limit)) and SiTU-GLU
  (beta1 tanh(a / beta1) sigmoid(a) beta2 tanh(g / beta2)); scaled_d<act> is fp64 autograd of it, for the input
  and for the scales (grad_scales, in the scales' dtype; None without compute_scale_grad);
- every element within 2^-20 of its value plus 2^-20 of its operands' magnitude in fp32 (bf16: half an ulp plus the
  same); grad_scales, a sum over the row, within fp32 summation's bound (2^-16 of the sum of |terms| over 64);
- glu_interleave_size 32: the same values as the plain layout on the de-interleaved row, bitwise;
- compute_grouped_dbias_dscales: dbias[g] += sum over g's rows of dy * scale, dscales[i] += dy[i] . bias[g];
- TE's te.ops ScaledSwiGLU over the emulation against the definition, output and both gradients."""
from __future__ import annotations

import types
from typing import Callable

import pytest
import torch
from activation_bounds import assert_within

from te_verify.te import tecpu
from te_verify.te.tecpu import triton_kernels

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
ROWS, WIDTH = 16, 128


def swiglu(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return a * torch.sigmoid(a) * g


def clamped(a: torch.Tensor, g: torch.Tensor, limit: float = 2.5, alpha: float = 1.0, offset: float = 0.5):
    a_c = torch.clamp(a, max=limit)
    return a_c * torch.sigmoid(alpha * a_c) * (torch.clamp(g, -limit, limit) + offset)


def situ(a: torch.Tensor, g: torch.Tensor, beta1: float = 1.5, beta2: float = 3.0) -> torch.Tensor:
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * beta2 * torch.tanh(g / beta2)


# tex name, its parameters after the quantizer (before glu_interleave_size), the fp64 definition over (a, g).
GATED = {"swiglu": ((), swiglu), "clamped_swiglu": ((2.5, 1.0, 0.5), clamped), "situglu": ((1.5, 3.0), situ)}


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(te=te_pytorch, tex=tex)


def operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (ROWS, WIDTH) over about [-6, 6] (both clamps and caps act), fp32 scales of both signs, dy."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(ROWS, WIDTH, generator=gen) * 3).to(dtype)
    scales = torch.randn(ROWS, generator=gen) + 0.25
    dy = torch.randn(ROWS, WIDTH // 2, generator=gen).to(dtype)
    return x, scales, dy


def check(fwd: Callable, bwd: Callable, definition: Callable, x: torch.Tensor, scales: torch.Tensor,
          dy: torch.Tensor, magnitude: torch.Tensor, name: str) -> None:
    """fwd(x, scales) and bwd(dy, x, scales) -> (dx, dscales) against the fp64 definition and its autograd;
    `magnitude` per output element (repeated over x's halves for the gated forms' dx)."""
    xl, sl = x.double().requires_grad_(), scales.double().requires_grad_()
    want = sl[:, None] * definition(xl)
    want_dx, want_ds = torch.autograd.grad(want, (xl, sl), dy.double())
    y = fwd(x, scales)
    assert y.dtype == x.dtype and y.shape == want.shape, f"scaled_{name}: {y.dtype} {list(y.shape)}"
    floor = 2.0 ** -20 * magnitude * scales.double().abs()[:, None]
    assert_within(y, want.detach(), floor, f"scaled_{name}")
    dx, ds = bwd(dy, x, scales)
    assert dx.dtype == x.dtype and ds.dtype == scales.dtype, f"scaled_d{name}: {dx.dtype}, {ds.dtype}"
    repeat = x.shape[-1] // dy.shape[-1]
    assert_within(dx, want_dx, (floor * dy.double().abs()).repeat(1, repeat), f"scaled_d{name} dx")
    terms = (dy.double() * (want / sl[:, None]).detach()).abs().sum(-1)
    err = (ds.double() - want_ds).abs()
    assert bool((err <= 2.0 ** -16 * terms + 1e-30).all()), f"scaled_d{name} grad_scales: max err {err.max():.3g}"


@pytest.mark.parametrize("name", list(GATED))
@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_gated_is_the_definition(te, dtype: torch.dtype, name: str) -> None:
    params, definition = GATED[name]
    x, scales, dy = operands(dtype)
    a, g = x.double().chunk(2, -1)
    magnitude = (1 + a * a) * (1 + g.abs())
    fwd = lambda x, s: getattr(te.tex, f"scaled_{name}")(x, s, None, *params)  # noqa: E731
    bwd_name = "scaled_clamped_dswiglu" if name == "clamped_swiglu" else f"scaled_d{name}"
    bwd = lambda dy, x, s: getattr(te.tex, bwd_name)(dy, x, s, None, *params)  # noqa: E731
    check(fwd, bwd, lambda t: definition(*t.chunk(2, -1)), x, scales, dy, magnitude, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_srelu_is_the_definition(te, dtype: torch.dtype) -> None:
    x, scales, _ = operands(dtype)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(12)).to(dtype)
    check(lambda x, s: te.tex.scaled_srelu(x, s, None), lambda dy, x, s: te.tex.scaled_dsrelu(dy, x, s, None),
          lambda t: torch.where(t > 0, t * t, 0.0), x, scales, dy, 1 + x.double() ** 2, "srelu")


def interleave(x: torch.Tensor, s: int) -> torch.Tensor:
    """[a | g] as segments [a(s) | g(s)] repeated."""
    a, g = x.chunk(2, -1)
    return torch.stack([a.reshape(x.shape[0], -1, s), g.reshape(x.shape[0], -1, s)], 2).reshape(x.shape)


@pytest.mark.parametrize("name", list(GATED))
def test_glu_interleave_is_the_plain_layout_permuted(te, name: str) -> None:
    params, _ = GATED[name]
    x, scales, dy = operands(torch.float32)
    bwd_name = "scaled_clamped_dswiglu" if name == "clamped_swiglu" else f"scaled_d{name}"
    plain = getattr(te.tex, f"scaled_{name}")(x, scales, None, *params, 0)
    mixed = getattr(te.tex, f"scaled_{name}")(interleave(x, 32), scales, None, *params, 32)
    assert torch.equal(mixed, plain), f"scaled_{name} with glu_interleave_size 32 differs from the plain layout"
    dx, ds = getattr(te.tex, bwd_name)(dy, x, scales, None, *params, 0, True)
    dx_i, ds_i = getattr(te.tex, bwd_name)(dy, interleave(x, 32), scales, None, *params, 32, True)
    assert torch.equal(dx_i, interleave(dx, 32)), f"{bwd_name}: interleaved dx is not the plain dx permuted"
    assert torch.equal(ds_i, ds), f"{bwd_name}: interleaved grad_scales differ"
    assert getattr(te.tex, bwd_name)(dy, x, scales, None, *params, 0, False)[1] is None, "grad_scales not skipped"


def test_scaled_checks(te) -> None:
    x, scales, _ = operands(torch.float32)
    with pytest.raises(RuntimeError, match="one scale per input row"):
        te.tex.scaled_swiglu(x, scales[:3], None)
    with pytest.raises(RuntimeError, match="glu_interleave_size 48"):
        te.tex.scaled_swiglu(x, scales, None, 48)


def test_grouped_dbias_dscales_is_the_definition() -> None:
    gen = torch.Generator().manual_seed(13)
    dy, scales = torch.randn(10, 32, generator=gen).bfloat16(), torch.rand(10, generator=gen)
    bias, offsets = torch.randn(3, 32, generator=gen).bfloat16(), torch.tensor([0, 4, 4, 10])
    dbias, dscales = torch.ones(3, 32), torch.full((10,), 2.0)
    triton_kernels.compute_grouped_dbias_dscales(dy, scales, bias, offsets, dbias, dscales)
    groups = torch.repeat_interleave(torch.arange(3), torch.diff(offsets))
    want_dbias = 1 + torch.zeros(3, 32, dtype=torch.float64).index_add_(0, groups, dy.double() * scales.double()[:, None])
    want_dscales = 2 + (dy.double() * bias.double()[groups]).sum(-1)
    torch.testing.assert_close(dbias.double(), want_dbias, rtol=1e-6, atol=1e-6, msg=lambda m: f"dbias: {m}")
    torch.testing.assert_close(dscales.double(), want_dscales, rtol=1e-6, atol=1e-6, msg=lambda m: f"dscales: {m}")


def test_te_ops_scaled_swiglu_matches_the_definition(te) -> None:
    x, scales, dy = operands(torch.float32)
    xt, st = x.clone().requires_grad_(), scales.clone().requires_grad_()
    y = te.te.ops.ScaledSwiGLU()(xt, st)
    y.backward(dy)
    xl, sl = x.double().requires_grad_(), scales.double().requires_grad_()
    want = sl[:, None] * swiglu(*xl.chunk(2, -1))
    want.backward(dy.double())
    torch.testing.assert_close(y.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.double(), xl.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"input grad: {m}")
    torch.testing.assert_close(st.grad.double(), sl.grad, rtol=1e-5, atol=1e-4, msg=lambda m: f"scales grad: {m}")
