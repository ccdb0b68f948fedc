"""FP8 block scaling's GEMM on sm90 as cuBLAS accumulates it (te_verify/te/tecpu/block_fp8_gemm.py), against its
definition in exact rational arithmetic: per 128-wide K tile the partial, then y = RN32(RN32(partial * s1) * s2 + y)
with s1 the 1D-scaled operand's scale (B's when both are); and reduction_order.fma, the FMA it applies, against the exactly rounded a * b + c."""
from __future__ import annotations

import random
import types
from fractions import Fraction

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import block_fp8_gemm, reduction_order


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()  # the default emulated sm90: cuBLAS's blockwise kernel
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

    return types.SimpleNamespace(tex=tex, Block=Float8BlockQuantizer)


def rn32(q: Fraction) -> float:
    """q rounded once to fp32, to nearest even (normal range)."""
    if q == 0:
        return 0.0
    e = abs(q.numerator).bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > abs(q):
        e -= 1
    ulp = Fraction(2) ** (e - 23)
    return float(round(q / ulp) * ulp)  # Fraction's round() takes ties to even


def fp32_triples(n: int, seed: int) -> list[tuple[float, float, float]]:
    rng = random.Random(seed)
    values = lambda: float(torch.tensor(rng.uniform(-4, 4) * 2.0 ** rng.randint(-20, 20), dtype=torch.float32))
    return [(values(), values(), values()) for _ in range(n)]


# a * b + c exactly is 1 + 2^-24 + (a tail below fp64's precision): just above fp32's halfway point, so it rounds up;
# rounded to fp64 first it is the halfway point itself, which rounds to even (1.0).
DOUBLE_ROUNDING = (2.0 ** -24 * (1 + 2896 * 2.0 ** -23), 1 - 2895 * 2.0 ** -23, 1.0)


def naive_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Planted: the fp64 sum rounded to fp32 (two roundings)."""
    return (a.double() * b.double() + c.double()).float()


@pytest.mark.parametrize("fma", [reduction_order.fma, pytest.param(naive_fma, marks=pytest.mark.xfail(strict=True))],
                         ids=["fma", "planted-double-rounding"])
def test_fma32_rounds_once(fma) -> None:
    triples = [DOUBLE_ROUNDING] + fp32_triples(2000, seed=3)
    a, b, c = (torch.tensor(column, dtype=torch.float32) for column in zip(*triples))
    got = fma(a, b, c)
    want = [rn32(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in triples]
    bad = [i for i, (g, w) in enumerate(zip(got.tolist(), want)) if g != w]
    assert bad == [], f"{len(bad)} of {len(triples)} differ, first at {bad[0]}: {triples[bad[0]]} -> {got[bad[0]]}"


def definition(x_raw, sx, x_1d, w_raw, sw, w_1d) -> torch.Tensor:
    """y[m, n] over K tiles: the tile's partial (exact: the inputs keep it within fp32), then the two roundings."""
    assert x_1d or w_1d, "cuBLAS takes no 2D x 2D GEMM"
    m, n, tiles = x_raw.shape[0], w_raw.shape[0], sx.shape[1]
    y = [[Fraction(0)] * n for _ in range(m)]
    for t in range(tiles):
        k = slice(t * 128, (t + 1) * 128)
        partial = (x_raw[:, k].double() @ w_raw[:, k].double().t()).tolist()
        for i in range(m):
            for j in range(n):
                a, b = Fraction(float(sx[i, t])), Fraction(float(sw[j, t]))
                first, second = (a, b) if x_1d else (b, a)
                y[i][j] = Fraction(rn32(Fraction(rn32(Fraction(partial[i][j]) * first)) * second + y[i][j]))
    return torch.tensor([[float(v) for v in row] for row in y], dtype=torch.float32)


def operand(te, shape: tuple[int, int], dim: int, seed: int):
    """Values of one binade (every tile's partial exact in fp32), scales not powers of 2 (so the order of the two
    scalings and the rounding between them show)."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.randint(0, 2, shape, generator=g) * 2 - 1) * (torch.rand(shape, generator=g) + 1) * 0.37
    quantizer = te.Block(te.tex.DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim,
                         force_pow_2_scales=False)
    return quantizer(values.to(torch.bfloat16))


LAYOUTS = {"TN": (True, False), "NN": (False, False), "NT": (False, True)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dims", [(1, 1), (1, 2), (2, 1)], ids=["1Dx1D", "1Dx2D", "2Dx1D"])
def test_product_is_the_tiled_fma_definition(te, layout: str, dims: tuple[int, int]) -> None:
    """B's dim first (B gives the output's rows: x in TE's test), A's second; three K tiles, 130 rows (a partial
    row block). The K-major copies are first checked against TE's own dequantize of that direction."""
    trans_a, trans_b = LAYOUTS[layout]
    m, n, k = 130, 24, 384
    B = operand(te, (k, m) if trans_b else (m, k), dim=dims[0], seed=1)
    A = operand(te, (n, k) if trans_a else (k, n), dim=dims[1], seed=2)
    x = block_fp8_gemm._k_major(B, "B", use_rowwise=not trans_b)
    w = block_fp8_gemm._k_major(A, "A", use_rowwise=trans_a)
    got = block_fp8_gemm.product(A, trans_a, B, trans_b)
    want = definition(*x, *w)
    for (raw, scales, _), t, transposed in ((x, B, trans_b), (w, A, not trans_a)):
        t.update_usage(rowwise_usage=not transposed, columnwise_usage=transposed)  # TE dequantizes the copy left
        logical = t.dequantize(dtype=torch.float32)
        values = raw * scales.repeat_interleave(128, 1)
        assert torch.equal(values, logical.t() if transposed else logical), "the K-major copy is not TE's values"
    bad = (got != want).nonzero().tolist()
    assert bad == [], f"{len(bad)} of {got.numel()} differ; first {bad[0]}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"


def dequantized_first(A, trans_a, B, trans_b) -> torch.Tensor:
    """Planted: each operand dequantized, then one fp32 product (the emulation's GEMM before block_fp8_gemm)."""
    from te_verify.te.tecpu import gemm

    return gemm.product(gemm._operand(A, "A", trans_a), trans_a, gemm._operand(B, "B", trans_b), trans_b)


def scales_swapped(A, trans_a, B, trans_b) -> torch.Tensor:
    """Planted: the 2D operand's scale applied first, the 1D one's in the FMA."""
    (x, sx, _), (w, sw, _) = block_fp8_gemm._k_major(B, "B", not trans_b), block_fp8_gemm._k_major(A, "A", trans_a)
    y = torch.zeros(x.shape[0], w.shape[0])
    for t in range(sx.shape[1]):
        k = slice(t * 128, (t + 1) * 128)
        y = reduction_order.fma((x[:, k] @ w[:, k].t()) * sw[None, :, t], sx[:, t, None].expand_as(y), y)
    return y


@pytest.mark.parametrize("planted", [dequantized_first, scales_swapped])
def test_planted_products_are_caught(te, planted) -> None:
    B, A = operand(te, (130, 384), dim=1, seed=1), operand(te, (24, 384), dim=2, seed=2)
    want = definition(*block_fp8_gemm._k_major(B, "B", True), *block_fp8_gemm._k_major(A, "A", True))
    assert torch.equal(block_fp8_gemm.product(A, True, B, False), want)
    assert not torch.equal(planted(A, True, B, False), want), f"{planted.__name__} matches the definition"


def test_accumulated_output_is_rounded_before_c_is_added(te) -> None:
    """cuBLAS's blockwise epilogue: the product rounded to the output dtype (BF16), then C added and rounded again,
    as TE's reference (y.to(out_dtype) + out); one rounding of product + C differs here."""
    B, A = operand(te, (136, 384), dim=1, seed=1), operand(te, (40, 384), dim=2, seed=2)
    c = (torch.randn(136, 40, generator=torch.Generator().manual_seed(5)) * 40).to(torch.bfloat16)
    d = c.clone()
    empty = torch.empty(0, dtype=torch.uint8)
    te.tex.generic_gemm(A, True, B, False, d, None, te.tex.DType.kBFloat16, None, te.tex.DType.kBFloat16, False, None,
                        False, empty, 0, True, True)
    y = block_fp8_gemm.product(A, True, B, False)
    assert torch.equal(d, y.to(torch.bfloat16) + c), "not rounded before C was added"
    assert not torch.equal(d, (y + c.float()).to(torch.bfloat16)), "the data cannot tell one rounding from two"
