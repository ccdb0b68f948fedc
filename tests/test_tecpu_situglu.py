"""tex.situglu / dsituglu (te_verify/te/tecpu/activation.py) held to the definition of TE's SiTU-GLU, written here in
fp64: over [a | g], out = beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(g / beta2); its gradient is fp64 autograd
of that formula.
- every element within 2^-20 of its value plus 2^-20 of its operands' magnitude (1 + |a|)(1 + |g|) (times |grad| for
  the gradient) in fp32; bf16 within half a bf16 ulp plus the same, against the fp64 value of the bf16 input;
- a on both sides of beta1 and g on both sides of beta2 (asserted: both tanh soft caps saturate somewhere); pybind's
  defaults (4, 25) and other betas, positionally and by keyword;
- planted faults (the betas swapped, the sigmoid dropped, the gate's derivative dropped) fail naming the function
  and the gradient's half; the clean twin passes;
- TE's te.ops.SiTUGLU over the emulation matches the definition, output and input gradient."""
from __future__ import annotations

import types
from typing import Callable

import pytest
import torch
from activation_bounds import assert_within, call

from te_verify.te import tecpu
from te_verify.te.tecpu import activation

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# (beta1, beta2); None: the call leaves them to pybind's defaults (4.0, 25.0).
PARAMS = [pytest.param(None, id="defaults"), pytest.param((1.5, 3.0), id="beta1.5-3")]
DEFAULTS = (4.0, 25.0)


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(te=te_pytorch, tex=tex)


def definition(x: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """SiTU-GLU in fp64 (the module docstring)."""
    a, g = x.chunk(2, -1)
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * beta2 * torch.tanh(g / beta2)


def operand(dtype: torch.dtype, beta1: float, beta2: float) -> torch.Tensor:
    """(4, 8, 128): a over about [-3 beta1, 3 beta1], g over about [-3 beta2, 3 beta2]."""
    x = torch.randn(4, 8, 128, generator=torch.Generator().manual_seed(3))
    x = torch.cat([x[..., :64] * 1.5 * beta1, x[..., 64:] * 1.5 * beta2], -1).to(dtype)
    a, g = x.double().chunk(2, -1)
    sides = {"|a| > beta1": a.abs() > beta1, "|a| < beta1": a.abs() < beta1, "a < 0": a < 0,
             "|g| > beta2": g.abs() > beta2, "|g| < beta2": g.abs() < beta2}
    assert all(int(m.sum()) >= 2 for m in sides.values()), {k: int(m.sum()) for k, m in sides.items()}
    return x


def check(te: types.SimpleNamespace, dtype: torch.dtype, params: tuple | None) -> None:
    """situglu and dsituglu on one case against the fp64 definition and its autograd."""
    beta1, beta2 = params or DEFAULTS
    x = operand(dtype, beta1, beta2)
    a, g = x.double().chunk(2, -1)
    m = (1 + a.abs()) * (1 + g.abs())
    y = call(te.tex.situglu, params, x)
    want = definition(x.double(), beta1, beta2)
    assert y.dtype == dtype and y.shape == want.shape, f"situglu: {y.dtype} {list(y.shape)}"
    assert_within(y, want, 2.0 ** -20 * m, f"situglu{params or ''}")
    dy = (torch.randn(want.shape, generator=torch.Generator().manual_seed(4)) + 0.5).to(dtype)
    leaf = x.double().requires_grad_()
    (want_dx,) = torch.autograd.grad(definition(leaf, beta1, beta2), leaf, dy.double())
    dx = call(te.tex.dsituglu, params, dy, x)
    assert dx.dtype == dtype and dx.shape == x.shape, f"dsituglu: {dx.dtype} {list(dx.shape)}"
    floor = 2.0 ** -20 * m * dy.double().abs()
    for half, got, wanted in zip(("d/da", "d/dg"), dx.chunk(2, -1), want_dx.chunk(2, -1)):
        assert_within(got, wanted, floor, f"dsituglu{params or ''} {half}")


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_situglu_and_its_gradient_are_the_definition(te, dtype: torch.dtype, params: tuple | None) -> None:
    check(te, dtype, params)


def test_betas_by_keyword(te) -> None:
    x, dy = operand(torch.float32, 1.5, 3.0), torch.ones(4, 8, 64)
    assert torch.equal(te.tex.situglu(x, None, beta1=1.5, beta2=3.0), te.tex.situglu(x, None, 1.5, 3.0))
    assert torch.equal(te.tex.dsituglu(dy, x, None, beta1=1.5, beta2=3.0), te.tex.dsituglu(dy, x, None, 1.5, 3.0))


CLEAN = activation._situ_halves


def _halves_with(fault: str) -> Callable:
    """activation._situ_halves with one planted fault."""
    def planted(x: torch.Tensor, beta1: float, beta2: float) -> tuple[torch.Tensor, ...]:
        if fault == "betas swapped":
            return CLEAN(x, beta2, beta1)
        act, dact, gate, dgate = CLEAN(x, beta1, beta2)
        if fault == "sigmoid dropped":
            a, _ = x.chunk(2, -1)
            act = act / torch.sigmoid(a)
        elif fault == "gate derivative dropped":
            dgate = torch.ones_like(dgate)
        return act, dact, gate, dgate

    return planted


@pytest.mark.parametrize("fault, culprit", [
    ("betas swapped", r"situglu\(1.5"), ("sigmoid dropped", r"situglu\(1.5"),
    ("gate derivative dropped", r"dsituglu\(1.5.* d/dg"), (None, None)])
def test_planted_fault_fails_naming_the_function(te, monkeypatch, fault: str | None, culprit: str | None) -> None:
    """Each fault fails the exactness check on one case, naming the function (and the gradient's half); the clean
    twin (None) passes the same check."""
    if fault is None:
        check(te, torch.float32, (1.5, 3.0))
        return
    monkeypatch.setattr(activation, "_situ_halves", _halves_with(fault))
    with pytest.raises(pytest.fail.Exception, match=culprit):
        check(te, torch.float32, (1.5, 3.0))


def test_te_ops_situglu_matches_the_definition(te) -> None:
    """TE's te.ops.SiTUGLU (fp32, betas 1.5 and 3) over the emulation: output and input gradient against the fp64
    definition and its autograd."""
    x = operand(torch.float32, 1.5, 3.0)
    xt = x.clone().requires_grad_()
    y = te.te.ops.SiTUGLU(beta1=1.5, beta2=3.0)(xt)
    y.sum().backward()
    leaf = x.double().requires_grad_()
    want = definition(leaf, 1.5, 3.0)
    want.sum().backward()
    torch.testing.assert_close(y.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.double(), leaf.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"input grad: {m}")
