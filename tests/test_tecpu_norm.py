"""The tex normalization emulation (te_verify/te/tecpu/norm.py) held to its definition, not to itself:
- layernorm_fwd / rmsnorm_fwd against an fp64 reference written here from the formulas (mu = mean(x), rsigma =
  1 / sqrt(var + eps), y = (x - mu) * rsigma * gamma (+1 when zero-centered) + beta; RMSNorm from mean(x^2)): fp32
  within fp32 rounding, bf16 within half a bf16 ulp of the reference; mu and rsigma fp32 vectors of the rows;
- layernorm_bwd / rmsnorm_bwd against fp64 autograd of that reference (dx, dgamma, dbeta); rmsnorm_bwd_add (te.ops'
  fused RMSNorm + extra-output backward) as rmsnorm_bwd with the other branch's gradient added to dx before dx is
  rounded (bf16: one rounding, within half an ulp of the fp64 sum, which dx rounded, then added, misses);
- quantized outputs bitwise equal to quantize(norm(x)): delayed scaling from the fp32 value (TE's fully fused
  kernel), current scaling, MXFP8 and FP8 block scaling from the value in the output dtype (amax and copies too);
- what it does not emulate raises; TE's LayerNormLinear and te.ops LayerNorm over it match torch eager."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
EPS = 1e-5


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_blockwise_tensor, float8_tensor, mxfp8_tensor

    dtypes = {torch.float32: tex.DType.kFloat32, torch.bfloat16: tex.DType.kBFloat16}
    return types.SimpleNamespace(te=te_pytorch, tex=tex, dtypes=dtypes, E4M3=tex.DType.kFloat8E4M3,
                                 delayed=float8_tensor.Float8Quantizer, current=float8_tensor.Float8CurrentScalingQuantizer,
                                 mxfp8=mxfp8_tensor.MXFP8Quantizer, block=float8_blockwise_tensor.Float8BlockQuantizer)


def operands(dtype: torch.dtype, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x (3-D: TE reads it as 2-D rows; 32 of them, MXFP8 blocks rows by 32), gamma and beta of a seeded draw; rows
    offset so mu is not ~0."""
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 8, 64, generator=gen) * 2 + 0.5).to(dtype)
    gamma = (torch.randn(64, generator=gen) * 0.5 + 1).to(dtype)
    beta = None if rms else torch.randn(64, generator=gen).to(dtype)
    return x, gamma, beta


def reference(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, zero_centered: bool,
              rms: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mu, rsigma) in fp64 from the definition."""
    x64 = x.double().reshape(-1, x.shape[-1])
    mu = x64.mean(-1, keepdim=True)
    centered = x64 if rms else x64 - mu
    rsigma = torch.rsqrt(centered.square().mean(-1, keepdim=True) + EPS)
    g = gamma.double() + (1.0 if zero_centered else 0.0)
    y = centered * rsigma * g + (beta.double() if beta is not None else 0.0)
    return y.reshape(x.shape), mu.reshape(-1), rsigma.reshape(-1)


def assert_close_to(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """fp32: normwise within 1e-6 of the value; bf16: each element within half a bf16 ulp (at most |v| 2^-8, 8
    significant bits) plus fp32 noise."""
    err = (got.double() - want).abs()
    if got.dtype == torch.bfloat16:
        bound = want.abs() * (2.0 ** -8 + 1e-6) + 1e-30
        worst = int((err > bound).sum())
        assert worst == 0, f"{what}: {worst} of {got.numel()} elements beyond half a bf16 ulp (max err {err.max():.3g})"
    else:
        rel = float(err.norm() / want.norm())
        assert rel < 1e-6, f"{what}: normwise error {rel:.3g} against the fp64 definition"


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_fwd_is_the_definition(te, dtype: torch.dtype, zero_centered: bool) -> None:
    x, gamma, beta = operands(dtype)
    y, mu, rsigma = te.tex.layernorm_fwd(x, gamma, beta, EPS, None, None, te.dtypes[dtype], 0, zero_centered)
    want_y, want_mu, want_rsigma = reference(x, gamma, beta, zero_centered)
    assert y.dtype == dtype and y.shape == x.shape, f"out {y.dtype} {list(y.shape)}"
    assert mu.dtype == rsigma.dtype == torch.float32 and mu.shape == rsigma.shape == (32,), \
        f"mu {mu.dtype} {list(mu.shape)}, rsigma {rsigma.dtype} {list(rsigma.shape)}: fp32, one per row"
    assert_close_to(mu, want_mu, "mu")
    assert_close_to(rsigma, want_rsigma, "rsigma")
    assert_close_to(y, want_y, "y")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_fwd_is_the_definition(te, dtype: torch.dtype) -> None:
    x, gamma, _ = operands(dtype, rms=True)
    y, mu, rsigma = te.tex.rmsnorm_fwd(x, gamma, EPS, None, None, te.dtypes[dtype], 0, False)
    want_y, _, want_rsigma = reference(x, gamma, None, False, rms=True)
    assert mu is None, "rmsnorm_fwd returns None for mu"
    assert_close_to(rsigma, want_rsigma, "rsigma")
    assert_close_to(y, want_y, "y")


def reference_grads(x, gamma, beta, dz, zero_centered: bool, rms: bool = False) -> list[torch.Tensor]:
    """dx, dgamma (and dbeta) by fp64 autograd of the definition."""
    leaves = [t.double().requires_grad_() for t in (x, gamma, *([] if rms else [beta]))]
    y, _, _ = reference(leaves[0], leaves[1], None if rms else leaves[2], zero_centered, rms)
    return list(torch.autograd.grad(y, leaves, dz.double()))


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_bwd_is_the_gradient_of_the_definition(te, rms: bool, zero_centered: bool) -> None:
    x, gamma, beta = operands(torch.float32, rms)
    dz = torch.randn(x.shape, generator=torch.Generator().manual_seed(8))
    if rms:
        _, _, rsigma = te.tex.rmsnorm_fwd(x, gamma, EPS, None, None, te.dtypes[x.dtype], 0, zero_centered)
        got = te.tex.rmsnorm_bwd(dz, x, rsigma, gamma, 0, zero_centered)
    else:
        _, mu, rsigma = te.tex.layernorm_fwd(x, gamma, beta, EPS, None, None, te.dtypes[x.dtype], 0, zero_centered)
        got = te.tex.layernorm_bwd(dz, x, mu, rsigma, gamma, 0, zero_centered)
    want = reference_grads(x, gamma, beta, dz, zero_centered, rms)
    for name, g, w in zip(("dx", "dgamma", "dbeta"), got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape, f"{name}: {g.dtype} {list(g.shape)}"
        rel = float((g.double() - w).norm() / w.norm())
        assert rel < 1e-5, f"{name}: normwise error {rel:.3g} against fp64 autograd of the definition"


def bwd_add_operands(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """x, gamma, dz and `add` (the extra output's gradient, of x's shape), scaled so dx and add are comparable:
    their sum rounds once in the kernel."""
    gen = torch.Generator().manual_seed(9)
    x, gamma, _ = operands(dtype, rms=True)
    dz = torch.randn(x.shape, generator=gen).to(dtype)
    add = (torch.randn(x.shape, generator=gen) * 0.5).to(dtype)
    return x, gamma, dz, add


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_bwd_add_is_the_gradient_plus_add(te, dtype: torch.dtype, zero_centered: bool) -> None:
    x, gamma, dz, add = bwd_add_operands(dtype)
    _, _, rsigma = te.tex.rmsnorm_fwd(x, gamma, EPS, None, None, te.dtypes[dtype], 0, zero_centered)
    dx, dgamma = te.tex.rmsnorm_bwd_add(dz, x, add, rsigma, gamma, 0, zero_centered)
    want_dx, want_dgamma = reference_grads(x, gamma, None, dz, zero_centered, rms=True)
    want_dx = want_dx + add.double()
    assert dx.dtype == dtype and dx.shape == x.shape, f"dx {dx.dtype} {list(dx.shape)}"
    assert dgamma.dtype == dtype and dgamma.shape == gamma.shape, f"dgamma {dgamma.dtype} {list(dgamma.shape)}"
    if dtype == torch.bfloat16:
        assert_within_half_ulp(dx, want_dx, "rmsnorm_bwd_add dx")
        lone = te.tex.rmsnorm_bwd(dz, x, rsigma, gamma, 0, zero_centered)[0]
        twice = int(((lone + add).double() - want_dx).abs().gt(half_ulp_bound(want_dx)).sum())
        assert twice > 0, "these data do not tell one rounding of dx + add from dx rounded, then added"
    else:
        rel = float((dx.double() - want_dx).norm() / want_dx.norm())
        assert rel < 1e-5, f"rmsnorm_bwd_add dx: normwise error {rel:.3g} against fp64 autograd plus add"
    rel = float((dgamma.double() - want_dgamma).norm() / want_dgamma.norm())
    assert rel < (1e-2 if dtype == torch.bfloat16 else 1e-5), f"rmsnorm_bwd_add dgamma: normwise error {rel:.3g}"


def half_ulp_bound(want: torch.Tensor) -> torch.Tensor:
    """Half a bf16 ulp of each value (|v| 2^-8) plus fp32 noise relative to the tensor's largest value (the fp32
    dx cancels against add)."""
    return want.abs() * 2.0 ** -8 + want.abs().max() * 2.0 ** -20


def assert_within_half_ulp(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got.double() - want).abs()
    worst = int((err > half_ulp_bound(want)).sum())
    assert worst == 0, f"{what}: {worst} of {got.numel()} elements beyond half a bf16 ulp (max err {err.max():.3g})"


def test_rmsnorm_bwd_add_checks_add(te) -> None:
    x, gamma, dz, add = bwd_add_operands(torch.float32)
    _, _, rsigma = te.tex.rmsnorm_fwd(x, gamma, EPS, None, None, te.dtypes[torch.float32], 0, False)
    with pytest.raises(RuntimeError, match="gamma's dtype"):
        te.tex.rmsnorm_bwd_add(dz, x, add.bfloat16(), rsigma, gamma, 0, False)
    with pytest.raises(RuntimeError, match="x's shape"):
        te.tex.rmsnorm_bwd_add(dz, x, add[:2], rsigma, gamma, 0, False)


def _bytes(t) -> list[torch.Tensor]:
    """Every buffer of a quantized tensor (data, copies, scales), for bitwise comparison."""
    names = ("_data", "_transpose", "_scale_inv", "_rowwise_data", "_columnwise_data", "_rowwise_scale_inv",
             "_columnwise_scale_inv")
    return [getattr(t, n) for n in names if getattr(t, n, None) is not None]


QUANTIZERS = {
    "delayed": lambda te: te.delayed(torch.tensor([3.0]), torch.zeros(1), te.E4M3, rowwise=True, columnwise=True),
    "current": lambda te: te.current(te.E4M3, torch.device("cpu"), rowwise=True, columnwise=True),
    "mxfp8": lambda te: te.mxfp8(te.E4M3, rowwise=True, columnwise=True),
    "block": lambda te: te.block(te.E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
}


@pytest.mark.parametrize("recipe", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_output_is_quantize_of_the_norm(te, dtype: torch.dtype, recipe: str) -> None:
    """Delayed scaling casts the fp32 value (amax too); the other quantizers quantize the value in the output
    dtype."""
    x, gamma, beta = operands(dtype)
    fused_q, twin_q = QUANTIZERS[recipe](te), QUANTIZERS[recipe](te)
    got, _, _ = te.tex.layernorm_fwd(x, gamma, beta, EPS, None, fused_q, te.dtypes[dtype], 0, False)
    source = torch.float32 if recipe == "delayed" else dtype
    y, _, _ = te.tex.layernorm_fwd(x, gamma, beta, EPS, None, None, te.dtypes[source], 0, False)
    want = te.tex.quantize(y, twin_q)
    assert got.dtype == dtype, f"quantized output's nominal dtype {got.dtype}, want {dtype}"
    pairs = list(zip(_bytes(got), _bytes(want)))
    assert len(pairs) >= 3, f"{recipe}: {len(pairs)} buffers compared"
    for i, (g, w) in enumerate(pairs):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{recipe}: buffer {i} differs from quantize(norm(x))"
    if recipe == "delayed":
        assert torch.equal(fused_q.amax, twin_q.amax), f"amax {fused_q.amax} vs {twin_q.amax}"


def test_what_the_emulation_does_not_emulate_raises(te, monkeypatch) -> None:
    x, gamma, beta = operands(torch.float32)
    args = (EPS, None, None, te.dtypes[torch.float32], 0, False)
    with pytest.raises(tecpu.Unemulated, match="preallocated ln_out"):
        te.tex.layernorm_fwd(x, gamma, beta, EPS, torch.empty_like(x), None, te.dtypes[torch.float32], 0, False)
    quantized = QUANTIZERS["current"](te)(x)
    with pytest.raises(tecpu.Unemulated, match="Float8Tensor input"):
        te.tex.layernorm_fwd(quantized, gamma, beta, *args)
    with pytest.raises(RuntimeError, match="same hidden size"):
        te.tex.layernorm_fwd(x, gamma[:32], beta, *args)
    monkeypatch.setenv("NVTE_NORM_FWD_USE_CUDNN", "1")
    with pytest.raises(tecpu.Unemulated, match="cuDNN's normalization kernels"):
        te.tex.rmsnorm_fwd(x, gamma, *args)


def test_te_layernorm_linear_matches_torch_eager(te) -> None:
    """TE's own LayerNormLinear (fp32, zero-centered gamma off) over the emulation: output and every gradient
    against layer_norm + linear in torch."""
    x, gamma, beta = operands(torch.float32)
    module = te.te.LayerNormLinear(64, 32, eps=EPS, params_dtype=torch.float32, device="cpu")
    with torch.no_grad():
        module.layer_norm_weight.copy_(gamma)
        module.layer_norm_bias.copy_(beta)
    params = [module.layer_norm_weight, module.layer_norm_bias, module.weight, module.bias]
    xt = x.clone().requires_grad_()
    got = module(xt)
    got.sum().backward()
    twins = [p.detach().clone().requires_grad_() for p in params]
    xe = x.clone().requires_grad_()
    want = torch.nn.functional.linear(torch.nn.functional.layer_norm(xe, (64,), twins[0], twins[1], EPS), twins[2], twins[3])
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, p, t in zip(("x", "ln_weight", "ln_bias", "weight", "bias"), [xt, *params], [xe, *twins]):
        torch.testing.assert_close(p.grad, t.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_te_ops_layernorm_matches_torch_eager(te) -> None:
    x, gamma, beta = operands(torch.float32)
    op = te.te.ops.LayerNorm(64, eps=EPS, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        op.weight.copy_(gamma)
        op.bias.copy_(beta)
    torch.testing.assert_close(op(x), torch.nn.functional.layer_norm(x, (64,), gamma, beta, EPS), rtol=1e-5, atol=1e-5)
