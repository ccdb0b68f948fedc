"""The tex activation emulation (te_verify/te/tecpu/activation.py) held to its definition, not to itself:
- gelu (the tanh approximation, written here with the exact sqrt(2/pi) and 0.044715), relu, srelu (x^2 for x > 0),
  qgelu (x sigmoid(1.702 x)), silu, and the gated forms act(a) * g over [a | g], against fp64 references written here:
  fp32 every element within 2^-20 of its value plus 2^-20 of its operands' magnitude m = (1 + x^2) (times |g| gated,
  times |grad| for a gradient): fp32's tanh/exp, TE's truncated constants, and the cancellation TE's own formulas
  carry where tanh nears -1 (x (0.5 + 0.5 tanh), 1 - tanh^2); bf16 within half a bf16 ulp (2^-8) of its value plus
  the same, against the fp64 value of the bf16 input;
- d<act> (and the gated gradient [grad act'(a) g | grad act(a)]) against fp64 autograd of those references, same bounds;
- dbias_d<act>: the bias gradient is the row sum of the gradient (within half a bf16 ulp plus fp32 summation's
  bound), the quantized gradient
  bitwise equal to quantize(d<act>) from the fp32 values (delayed scaling, TE's fused kernel) or from the values in
  the gradient's dtype under the fp32 values' amax (current scaling), amax too (the block-scaled quantizers:
  test_tecpu_activation_quantized.py);
- what it does not emulate raises; TE's LayerNormMLP over it (relu and the default gelu) matches the torch twin."""
from __future__ import annotations

import math
import types

import pytest
import torch
from layernorm_mlp_twin import assert_matches_torch, seed_parameters

from te_verify.te import tecpu
from te_verify.te.tecpu import quantize

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# fp64 definitions (TE's common/util/math.h names; gelu: Hendrycks & Gimpel's tanh approximation).
SQRT_2_PI = math.sqrt(2.0 / math.pi)
DEFINITIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + torch.tanh(SQRT_2_PI * (x + 0.044715 * x ** 3))),
    "relu": lambda x: torch.clamp_min(x, 0.0),
    "srelu": lambda x: torch.clamp_min(x, 0.0) ** 2,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": lambda x: x * torch.sigmoid(x),
}
GATED = {"geglu": "gelu", "reglu": "relu", "sreglu": "srelu", "qgeglu": "qgelu", "swiglu": "silu"}


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_tensor

    return types.SimpleNamespace(te=te_pytorch, tex=tex, E4M3=tex.DType.kFloat8E4M3, delayed=float8_tensor.Float8Quantizer,
                                 current=float8_tensor.Float8CurrentScalingQuantizer)


def operand(dtype: torch.dtype, width: int = 64, seed: int = 3) -> torch.Tensor:
    """A seeded 3-D input over [-4, 4] (both signs, the curved parts), no exact zeros."""
    x = torch.randn(4, 8, width, generator=torch.Generator().manual_seed(seed)) * 2
    return torch.where(x == 0, 0.5, x).to(dtype)


def reference(name: str, x: torch.Tensor) -> torch.Tensor:
    if name in GATED:
        a, g = x.chunk(2, -1)
        return DEFINITIONS[GATED[name]](a) * g
    return DEFINITIONS[name](x)


def magnitude(name: str, x: torch.Tensor, grad: torch.Tensor | None = None) -> torch.Tensor:
    """Per output element, the operands' magnitude m of the module docstring (fp64)."""
    x = x.double()
    if name not in GATED:
        m = 1 + x * x
        return m if grad is None else m * grad.double().abs()
    a, g = x.chunk(2, -1)
    m = 1 + a * a
    if grad is None:
        return m * g.abs()
    dy = grad.double().abs()
    return torch.cat([dy * m * g.abs(), dy * m], -1)


def assert_elementwise(got: torch.Tensor, want: torch.Tensor, what: str, floor: torch.Tensor) -> None:
    """Every element within its bound (module docstring): a relative part, and `floor` per element."""
    err = (got.double() - want).abs()
    rel = 2.0 ** -8 + 1e-6 if got.dtype == torch.bfloat16 else 2.0 ** -20
    bad = int((err > want.abs() * rel + floor).sum())
    assert bad == 0, f"{what}: {bad} of {got.numel()} elements beyond the bound (max err {err.max():.3g})"


@pytest.mark.parametrize("name", [*DEFINITIONS, *GATED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_and_its_gradient_are_the_definition(te, dtype: torch.dtype, name: str) -> None:
    x = operand(dtype)
    y = getattr(te.tex, name)(x, None)
    want = reference(name, x.double())
    assert y.dtype == dtype and y.shape == want.shape, f"{name}: {y.dtype} {list(y.shape)}"
    assert_elementwise(y, want, name, 2.0 ** -20 * magnitude(name, x))
    dy = operand(dtype, want.shape[-1], seed=4)
    leaf = x.double().requires_grad_()
    (want_dx,) = torch.autograd.grad(reference(name, leaf), leaf, dy.double())
    dx = getattr(te.tex, f"d{name}")(dy, x, None)
    assert dx.dtype == dtype and dx.shape == x.shape, f"d{name}: {dx.dtype} {list(dx.shape)}"
    assert_elementwise(dx, want_dx, f"d{name}", 2.0 ** -20 * magnitude(name, x, dy))


def _bytes(t) -> list[torch.Tensor]:
    return [getattr(t, n) for n in ("_data", "_transpose", "_scale_inv") if getattr(t, n, None) is not None]


QUANTIZERS = {
    "delayed": lambda te: te.delayed(torch.tensor([3.0]), torch.zeros(1), te.E4M3, rowwise=True, columnwise=True),
    "current": lambda te: te.current(te.E4M3, torch.device("cpu"), rowwise=True, columnwise=True),
}


@pytest.mark.parametrize("recipe", list(QUANTIZERS))
@pytest.mark.parametrize("name", ["gelu", "srelu"])
def test_dbias_dact_quantizes_the_gradient_and_sums_it(te, name: str, recipe: str) -> None:
    """bias.cpp's dact_dbias: delayed scaling fused from the fp32 values, current scaling from the bf16 values under
    the fp32 values' amax (the activation kernel's, handed to quantize_with_amax)."""
    x, dy = operand(torch.bfloat16), operand(torch.bfloat16, seed=4)
    fused_q, twin_q = QUANTIZERS[recipe](te), QUANTIZERS[recipe](te)
    dbias, got = getattr(te.tex, f"dbias_d{name}")(dy, x, fused_q)
    dx32 = getattr(te.tex, f"d{name}")(dy.float(), x.float(), None)
    source = dx32 if recipe == "delayed" else dx32.to(torch.bfloat16)
    want = te.tex.quantize(source, twin_q) if recipe == "delayed" else \
        quantize.quantize_with_amax(source, twin_q, dx32.abs().max())
    pairs = list(zip(_bytes(got), _bytes(want)))
    assert len(pairs) >= 2, f"{recipe}: {len(pairs)} buffers compared"
    for i, (g, w) in enumerate(pairs):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{name}/{recipe}: buffer {i} differs"
    if recipe == "delayed":
        assert torch.equal(fused_q.amax, twin_q.amax), f"amax {fused_q.amax} vs {twin_q.amax}"
    terms = source.double().reshape(-1, 64)
    assert dbias.dtype == torch.bfloat16 and dbias.shape == (64,), f"dbias {dbias.dtype} {list(dbias.shape)}"
    # Half a bf16 ulp of the exact row sum, plus an fp32 summation's bound over its 32 terms.
    assert_elementwise(dbias, terms.sum(0), f"dbias_d{name}", floor=terms.abs().sum(0) * 32 * 2.0 ** -24)


def test_what_the_emulation_does_not_emulate_raises(te) -> None:
    x = operand(torch.float32)
    with pytest.raises(tecpu.Unemulated, match="activation quantizing its output with object"):
        te.tex.gelu(x, object())
    with pytest.raises(tecpu.Unemulated, match="transformer_engine_torch.group_scaled_swiglu is not emulated"):
        te.tex.group_scaled_swiglu(x, torch.ones(32), None)
    with pytest.raises(RuntimeError, match="last dim must be even"):
        te.tex.swiglu(x[..., :63], None)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_te_layernorm_mlp_matches_torch_eager(te, activation: str) -> None:
    """TE's own LayerNormMLP (fp32) over the emulation against layer_norm, fc1, the activation, fc2 in torch: output
    and every gradient (relu reaches tex.relu/drelu; gelu, TE's default, its bias+GELU in TE's Python)."""
    from te_verify.models.normed import ACTIVATIONS

    x = operand(torch.float32, 32)
    module = te.te.LayerNormMLP(32, 64, activation=activation, params_dtype=torch.float32, device="cpu")
    seed_parameters(module, 0.3)
    assert_matches_torch(module, x, ACTIVATIONS[activation])
