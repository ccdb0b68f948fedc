"""tex.clamped_swiglu / clamped_dswiglu (te_verify/te/tecpu/activation.py) held to the definition of TE's clamped
SwiGLU (GPT-OSS), written here in fp64: over [a | g], a_c = min(a, limit), out = a_c sigmoid(alpha a_c) *
(clamp(g, -limit, limit) + offset); its gradient is fp64 autograd of that formula (torch.clamp's subgradient keeps
both bounds, as TE's kernels do).
- every element within 2^-20 of its value plus 2^-20 of its operands' magnitude (1 + a_c^2)(1 + |g_c| + |offset|)
  (times |grad| for the gradient) in fp32; bf16 within half a bf16 ulp plus the same, against the fp64 value of the
  bf16 input;
- each case has inputs on both sides of every clamp and exactly at the limits (asserted, so a case cannot pass
  without exercising them); the defaults (7, 1.702, 1) and other parameters, passed positionally and by keyword;
- planted faults (the clamp on the wrong half, alpha dropped, the offset dropped, the gate's gradient not masked)
  fail naming the function and the half; the clean twin passes;
- quantized outputs: test_tecpu_activation_quantized.py; TE's LayerNormMLP with activation "clamped_swiglu" and its
  activation_params over the emulation matches this formula in torch, output and every gradient."""
from __future__ import annotations

import types
from typing import Callable

import pytest
import torch
from activation_bounds import assert_within, call
from layernorm_mlp_twin import assert_matches_torch, seed_parameters

from te_verify.te import tecpu
from te_verify.te.tecpu import activation

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# (limit, alpha, glu_linear_offset); None: the call leaves them to pybind's defaults (7.0, 1.702, 1.0).
PARAMS = [pytest.param(None, id="defaults"), pytest.param((2.5, 1.0, 0.5), id="limit2.5-alpha1-offset0.5"),
          pytest.param((1.0, 3.0, -1.0), id="limit1-alpha3-offset-1")]
DEFAULTS = (7.0, 1.702, 1.0)


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(te=te_pytorch, tex=tex)


def definition(x: torch.Tensor, limit: float, alpha: float, offset: float) -> torch.Tensor:
    """Clamped SwiGLU in fp64 (the module docstring)."""
    a, g = x.chunk(2, -1)
    a_c = torch.clamp(a, max=limit)
    return a_c * torch.sigmoid(alpha * a_c) * (torch.clamp(g, -limit, limit) + offset)


def operand(dtype: torch.dtype, limit: float, seed: int = 3) -> torch.Tensor:
    """(4, 8, 128): a and g over about [-2 limit, 2 limit], a few elements exactly at +-limit."""
    x = torch.randn(4, 8, 128, generator=torch.Generator().manual_seed(seed)) * limit
    x[0, 0, :4] = torch.tensor([limit, -limit, limit, -limit])  # a at the limits
    x[0, 0, 64:68] = torch.tensor([limit, -limit, -limit, limit])  # g at the limits
    x = x.to(dtype)
    a, g = x.double().chunk(2, -1)
    sides = {"a > limit": a > limit, "a < limit": a < limit, "a == limit": a == limit, "g > limit": g > limit,
             "g < -limit": g < -limit, "|g| < limit": g.abs() < limit, "g == -limit": g == -limit}
    assert all(int(m.sum()) >= 2 for m in sides.values()), {k: int(m.sum()) for k, m in sides.items()}
    return x


def magnitude(x: torch.Tensor, limit: float, offset: float) -> torch.Tensor:
    """Per output element, (1 + a_c^2)(1 + |g_c| + |offset|): the operands' magnitude of the bound (the gate's sum
    may cancel)."""
    a, g = x.double().chunk(2, -1)
    return (1 + torch.clamp(a, max=limit) ** 2) * (1 + torch.clamp(g, -limit, limit).abs() + abs(offset))


def check(te: types.SimpleNamespace, dtype: torch.dtype, params: tuple | None) -> None:
    """clamped_swiglu and clamped_dswiglu on one case against the fp64 definition and its autograd."""
    limit, alpha, offset = params or DEFAULTS
    x = operand(dtype, limit)
    y = call(te.tex.clamped_swiglu, params, x)
    want = definition(x.double(), limit, alpha, offset)
    assert y.dtype == dtype and y.shape == want.shape, f"clamped_swiglu: {y.dtype} {list(y.shape)}"
    m = magnitude(x, limit, offset)
    assert_within(y, want, 2.0 ** -20 * m, f"clamped_swiglu{params or ''}")
    dy = (torch.randn(want.shape, generator=torch.Generator().manual_seed(4)) + 0.5).to(dtype)
    leaf = x.double().requires_grad_()
    (want_dx,) = torch.autograd.grad(definition(leaf, limit, alpha, offset), leaf, dy.double())
    dx = call(te.tex.clamped_dswiglu, params, dy, x)
    assert dx.dtype == dtype and dx.shape == x.shape, f"clamped_dswiglu: {dx.dtype} {list(dx.shape)}"
    floor = 2.0 ** -20 * m * dy.double().abs()
    for half, got, wanted in zip(("d/da", "d/dg"), dx.chunk(2, -1), want_dx.chunk(2, -1)):
        assert_within(got, wanted, floor, f"clamped_dswiglu{params or ''} {half}")


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_swiglu_and_its_gradient_are_the_definition(te, dtype: torch.dtype, params: tuple | None) -> None:
    check(te, dtype, params)


def test_parameters_by_keyword_as_layernorm_mlp_passes_them(te) -> None:
    """LayerNormMLP calls activation_func(x, quantizer, **activation_params): pybind's keyword names."""
    x, dy = operand(torch.float32, 2.5), torch.ones(4, 8, 64)
    kwargs = {"limit": 2.5, "alpha": 1.0, "glu_linear_offset": 0.5}
    assert torch.equal(te.tex.clamped_swiglu(x, None, **kwargs), te.tex.clamped_swiglu(x, None, 2.5, 1.0, 0.5))
    assert torch.equal(te.tex.clamped_dswiglu(dy, x, None, **kwargs),
                       te.tex.clamped_dswiglu(dy, x, None, 2.5, 1.0, 0.5))


def _halves_with(fault: str) -> Callable:
    """activation._clamped_halves with one planted fault."""
    def planted(x: torch.Tensor, limit: float, alpha: float, offset: float) -> tuple[torch.Tensor, ...]:
        act, dact, gate, dgate = CLEAN(x, limit, alpha, offset)
        a, g = x.chunk(2, -1)
        if fault == "clamp on the wrong half":  # a clamped into [-limit, limit], g only above
            act, _, _, _ = CLEAN(torch.cat([a.clamp(-limit, limit), g], -1), limit, alpha, offset)
            gate = g.clamp(max=limit) + offset
        elif fault == "alpha dropped":
            act, dact, _, _ = CLEAN(x, limit, 1.0, offset)
        elif fault == "offset dropped":
            gate = gate - offset
        elif fault == "gate gradient not masked":
            dgate = torch.ones_like(dgate)
        return act, dact, gate, dgate

    return planted


CLEAN = activation._clamped_halves


@pytest.mark.parametrize("fault, culprit", [
    ("clamp on the wrong half", r"clamped_swiglu\(2.5"), ("alpha dropped", r"clamped_swiglu\(2.5"),
    ("offset dropped", r"clamped_swiglu\(2.5"), ("gate gradient not masked", r"clamped_dswiglu\(2.5.* d/dg"),
    (None, None)])
def test_planted_fault_fails_naming_the_function(te, monkeypatch, fault: str | None, culprit: str | None) -> None:
    """Each fault fails the exactness check on one case, naming the function (and the gradient's half); the clean
    twin (None) passes the same check."""
    if fault is None:
        check(te, torch.float32, (2.5, 1.702, 0.5))
        return
    monkeypatch.setattr(activation, "_clamped_halves", _halves_with(fault))
    with pytest.raises(pytest.fail.Exception, match=culprit):
        check(te, torch.float32, (2.5, 1.702, 0.5))


def test_te_layernorm_mlp_clamped_swiglu_matches_torch_eager(te) -> None:
    """TE's LayerNormMLP (fp32, activation "clamped_swiglu", limit 1.0 so both clamps act) over the emulation against
    layer_norm, fc1, the definition, fc2 in torch: output and every gradient."""
    params = {"limit": 1.0, "alpha": 1.5, "glu_linear_offset": 0.5}
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
    module = te.te.LayerNormMLP(32, 64, activation="clamped_swiglu", activation_params=params,
                                params_dtype=torch.float32, device="cpu")
    seed_parameters(module, 0.5)

    def both_clamps_act(h: torch.Tensor) -> None:
        a, g = h.chunk(2, -1)
        assert (a > 1).any() and (g.abs() > 1).any() and (g.abs() < 1).any(), "the case leaves a clamp inactive"

    clamped = lambda h: definition(h, params["limit"], params["alpha"], params["glu_linear_offset"])
    assert_matches_torch(module, x, clamped, both_clamps_act)
