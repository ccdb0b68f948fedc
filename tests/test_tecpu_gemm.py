"""tex.generic_gemm / te_general_grouped_gemm through TE's own wrappers (cpp_extensions.general_gemm,
general_grouped_gemm) over the emulation. Row-major reading of TE's layouts: TN = B @ A^T (x @ W^T), NN = B @ A
(dy @ W), NT = B^T @ A (dy^T @ x). fp32 results are compared bit-exactly with torch.matmul (the emulation runs
the same fp32 matmul); FP8 results with the product of the dequantized operands (power-of-2 scales keep that
exact); FP8 canonicalization errors follow common/gemm/cublaslt_gemm.cu CanonicalizeGemmInput on sm90."""
from __future__ import annotations

import math
import types

import pytest
import torch

from te_verify.te import tecpu
from ulps import assert_close_ulps

LAYOUTS = ["TN", "NN", "NT"]


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.cpp_extensions import general_gemm, general_grouped_gemm
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer

    return types.SimpleNamespace(tex=tex, gemm=general_gemm, grouped=general_grouped_gemm, Q=Float8Quantizer)


def operands(layout: str, m: int = 24, n: int = 40, k: int = 32, dtype: torch.dtype = torch.float32,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, expected op(B) @ op(A)) for an m x n output with reduction k, stored as TE stores them."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, k, generator=g) if layout[0] == "T" else torch.randn(k, n, generator=g)
    b = torch.randn(k, m, generator=g) if layout[1] == "T" else torch.randn(m, k, generator=g)
    a, b = a.to(dtype), b.to(dtype)
    return a, b, reference(a, b, layout)


def reference(a: torch.Tensor, b: torch.Tensor, layout: str) -> torch.Tensor:
    opa = a.t() if layout[0] == "T" else a
    opb = b.t() if layout[1] == "T" else b
    return opb @ opa


def fp8(te, t: torch.Tensor, scale: float, rowwise: bool = True, columnwise: bool = True):
    q = te.Q(torch.tensor([scale]), torch.zeros(1), te.tex.DType.kFloat8E4M3, rowwise=rowwise, columnwise=columnwise)
    return q(t)


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {tuple(got.shape)} {got.dtype} != {tuple(want.shape)} {want.dtype}"
    diff = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    assert torch.equal(got, want), f"{what}: max |diff| {diff}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_matches_torch_matmul_exactly(te, layout: str) -> None:
    a, b, want = operands(layout)
    out, bias_grad, *_ = te.gemm(a, b, out_dtype=torch.float32, layout=layout, grad=layout != "TN")
    assert_equal(out, want, f"fp32 {layout} GEMM")
    assert bias_grad is None, f"{layout}: bias gradient without a bias"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_within_bf16_tolerance(te, layout: str) -> None:
    a, b, want = operands(layout, dtype=torch.bfloat16)
    out, *_ = te.gemm(a, b, out_dtype=torch.bfloat16, layout=layout)
    assert out.dtype == torch.bfloat16, f"bf16 {layout}: output dtype {out.dtype}"
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=1e-2, msg=lambda m: f"bf16 {layout} GEMM: {m}")


def test_accumulate_adds_into_out(te) -> None:
    a, b, want = operands("NT", m=32, n=16, k=24)
    out = torch.full_like(want, 0.5)
    result, *_ = te.gemm(a, b, out_dtype=torch.float32, layout="NT", grad=True, accumulate=True, out=out)
    assert result.data_ptr() == out.data_ptr(), "accumulate: result must be the given `out` buffer"
    assert_equal(out, want + 0.5, "NT GEMM accumulated into out")


def test_forward_bias_is_added(te) -> None:
    a, b, want = operands("TN")
    bias = torch.randn(a.shape[0])
    out, bias_grad, *_ = te.gemm(a, b, out_dtype=torch.float32, layout="TN", bias=bias)
    assert_equal(out, want + bias, "TN GEMM with bias")
    assert bias_grad is None, "forward with bias returned a bias gradient"


def test_alpha_scales_the_product_not_the_bias(te) -> None:
    """common/include/transformer_engine/gemm.h (nvte_cublas_gemm_scaled): `D = alpha*AB + bias`."""
    a, b, want = operands("TN")
    bias = torch.randn(a.shape[0])
    out, *_ = te.gemm(a, b, out_dtype=torch.float32, layout="TN", bias=bias, alpha=2.0)
    assert_equal(out, 2.0 * want + bias, "TN GEMM with alpha=2 and bias (alpha*AB + bias)")


def test_bias_gradient_is_column_sums_of_b(te) -> None:
    a, b, want = operands("NT", m=48, n=16, k=32)  # wgrad: A = x (32x16), B = dy (32x48)
    out, bias_grad, *_ = te.gemm(a, b, out_dtype=torch.float32, layout="NT", grad=True, bias=torch.empty(48))
    assert_equal(out, want, "NT GEMM with bias gradient")
    assert bias_grad is not None, "grad=True with a bias returned no bias gradient"
    assert_equal(bias_grad, b.sum(0), "bias gradient (column sums of B)")


@pytest.mark.parametrize("accumulate", [True, False])
def test_a_gemm_over_zero_tokens_runs_no_gemm_and_reads_no_scale(te, accumulate) -> None:
    """gemm.cpp: with an operand of no elements no GEMM runs; D is left as it is when accumulating, else zeroed, and
    the bias gradient is zeroed. An empty FP8 operand's scale was never computed (uninitialized on a GPU: NaN here),
    so a product over it would poison a main_grad it accumulates into."""
    x, dy = fp8(te, torch.empty(0, 16), 1.0), fp8(te, torch.empty(0, 48), 1.0)
    for t in (x, dy):
        t._scale_inv.fill_(float("nan"))
    out = torch.full((48, 16), 0.5)
    result, bias_grad, *_ = te.gemm(x, dy, out_dtype=torch.float32, layout="NT", grad=True, accumulate=accumulate,
                                    out=out, bias=torch.empty(48))
    assert result.data_ptr() == out.data_ptr()
    assert_equal(out, torch.full((48, 16), 0.5 if accumulate else 0.0), "wgrad over zero tokens")
    assert_equal(bias_grad, torch.zeros(48), "bias gradient over zero tokens")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_operands_give_product_of_dequantized(te, layout: str) -> None:
    a, b, _ = operands(layout, m=16, n=32, k=48)
    qa, qb = fp8(te, a, 2.0), fp8(te, b, 0.5)
    out, *_ = te.gemm(qa, qb, out_dtype=torch.float32, layout=layout, grad=layout != "TN")
    want = reference(qa.dequantize(dtype=torch.float32), qb.dequantize(dtype=torch.float32), layout)
    assert_equal(out, want, f"FP8 {layout} GEMM vs product of dequantized operands")


@pytest.mark.parametrize("layout, side", [("NN", "A"), ("NT", "A"), ("NT", "B")])
def test_fp8_operand_without_needed_columnwise_copy_raises(te, layout: str, side: str) -> None:
    a, b, _ = operands(layout, m=16, n=32, k=48)
    qa = fp8(te, a, 1.0, columnwise=side != "A")
    qb = fp8(te, b, 1.0, columnwise=side != "B")
    with pytest.raises(RuntimeError, match=f"Input {side} is missing column-wise usage"):
        te.gemm(qa, qb, out_dtype=torch.float32, layout=layout, grad=True)


def test_fp8_invalidated_transpose_counts_as_missing(te) -> None:
    """NVTETensorFromFloat8Tensor (csrc/type_converters.cpp) passes the transpose only when
    `not _transpose_invalid`: after TE's _reset_caches() (an in-place update) the stale copy must not be used."""
    a, b, _ = operands("NN", m=16, n=32, k=48)
    qa, qb = fp8(te, a, 1.0), fp8(te, b, 1.0)
    qa._reset_caches()
    assert qa._transpose is not None and qa._transpose_invalid, "setup: a stale, invalidated _transpose"
    with pytest.raises(RuntimeError, match="Input A is missing column-wise usage"):
        te.gemm(qa, qb, out_dtype=torch.float32, layout="NN", grad=True)


def test_fp8_k_not_divisible_by_16_raises(te) -> None:
    a, b, _ = operands("TN", m=16, n=32, k=24)
    with pytest.raises(RuntimeError, match="Leading dimension requirement on A for FP8 GEMM"):
        te.gemm(fp8(te, a, 1.0), fp8(te, b, 1.0), out_dtype=torch.float32, layout="TN")


def gelu64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cuBLAS's GELU epilogue (the tanh approximation) and its derivative, in float64."""
    x = x.double()
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


def test_gelu_epilogue_returns_the_pre_activation_and_its_gelu(te) -> None:
    """GELU_AUX_BIAS (gemm.cpp: gelu, not grad): out = gelu(AB + bias), pre_gelu_out = AB + bias (output dtype)."""
    a, b, want = operands("TN")
    bias = torch.randn(a.shape[0])
    out, bias_grad, pre, _ = te.gemm(a, b, out_dtype=torch.float32, layout="TN", bias=bias, gelu=True)
    assert_equal(pre, want + bias, "pre_gelu_out (the pre-activation)")
    want_out = gelu64(want.double() + bias.double())[0]
    assert_close_ulps(out, want_out, want_out.abs() + 1.0, 8, "GELU epilogue output")
    assert bias_grad is None, "a forward GEMM returned a bias gradient"


def test_dgelu_epilogue_multiplies_by_gelus_derivative_and_sums_it_for_the_bias(te) -> None:
    """DGELU_BGRAD (gemm.cpp: gelu and grad): out = (dy W) * gelu'(gelu_in), bias gradient = its column sums."""
    a, b, want = operands("NN")  # dgrad: A = W, B = dy
    gelu_in = torch.randn(want.shape)
    out, bias_grad, pre, _ = te.gemm(a, b, out_dtype=torch.float32, layout="NN", grad=True, gelu=True,
                                     gelu_in=gelu_in, bias=torch.empty(want.shape[1]))
    expected = want.double() * gelu64(gelu_in)[1]
    assert_close_ulps(out, expected, expected.abs() + 1.0, 16, "DGELU epilogue output")
    assert_close_ulps(bias_grad, expected.sum(0), expected.sum(0).abs() + 1.0, 16 * want.shape[0],
                      "DGELU_BGRAD bias gradient")
    assert pre is None, "a backward GEMM returned a pre-activation"


@pytest.mark.parametrize("single_output", [False, True])
def test_grouped_gemm_matches_per_group_matmuls(te, single_output: bool) -> None:
    g = torch.Generator().manual_seed(5)
    m_splits, n, k = [8, 0, 24, 16], 32, 16
    weights = [torch.randn(n, k, generator=g) for _ in m_splits]
    inputs = list(torch.randn(sum(m_splits), k, generator=g).split(m_splits))
    want = [x @ w.t() for x, w in zip(inputs, weights)]
    if single_output:
        out = [torch.zeros(sum(m_splits), n)]
    else:
        out = [torch.zeros(m, n) for m in m_splits]
    result, *_ = te.grouped(weights, inputs, out, [None] * len(m_splits), torch.float32, layout="TN",
                            m_splits=m_splits, single_output=single_output)
    got = list(result[0].split(m_splits)) if single_output else result
    for i, (o, w) in enumerate(zip(got, want)):
        assert_equal(o, w, f"grouped GEMM group {i} (m={m_splits[i]}, single_output={single_output})")


def test_grouped_gemm_writes_into_the_outputs_a_tuple_holds(te) -> None:
    """The C++ takes D as a vector of tensors and writes into them: a tuple (as TE's test_fp8_grouped_gemm passes,
    `torch.split`'s result) works as a list does, and the tensors it holds are the results."""
    g = torch.Generator().manual_seed(6)
    m_splits, n, k = [8, 16], 32, 16
    weights = [torch.randn(n, k, generator=g) for _ in m_splits]
    inputs = list(torch.randn(sum(m_splits), k, generator=g).split(m_splits))
    out = tuple(torch.zeros(m, n) for m in m_splits)
    te.grouped(weights, inputs, out, [None] * len(m_splits), torch.float32, layout="TN", m_splits=m_splits)
    for i, (o, x, w) in enumerate(zip(out, inputs, weights)):
        assert_equal(o, x @ w.t(), f"grouped GEMM group {i} written into the tuple's tensor")


@pytest.mark.parametrize("a_dim, b_dim, fails", [(None, 1, True), (1, None, True), (2, 1, False)])
def test_operands_of_incompatible_scaling_modes_raise_tes_error(te, a_dim, b_dim, fails) -> None:
    """cuBLAS takes one scaling mode, or FP8 block scaling's 1D with 2D (cublaslt_gemm.cu CanonicalizeGemmInput);
    per-tensor FP8 (None here) against FP8 block scaling raises TE's error naming both modes."""
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

    def quantize(t: torch.Tensor, dim: int | None):
        if dim is None:
            return fp8(te, t, 1.0)
        return Float8BlockQuantizer(te.tex.DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)(t)

    a, b, _ = operands("TN", m=128, n=128, k=128)
    qa, qb = quantize(a, a_dim), quantize(b, b_dim)
    modes = {None: "NVTE_DELAYED_TENSOR_SCALING", 1: "NVTE_BLOCK_SCALING_1D", 2: "NVTE_BLOCK_SCALING_2D"}
    if not fails:
        out, *_ = te.gemm(qa, qb, out_dtype=torch.float32, layout="TN")
        assert out.shape == (128, 128)
        return
    with pytest.raises(RuntimeError, match=f"compatible scaling modes, but got A.scaling_mode = {modes[a_dim]}, "
                                           f"B.scaling_mode = {modes[b_dim]}"):
        te.gemm(qa, qb, out_dtype=torch.float32, layout="TN")


@pytest.mark.parametrize("layout, k, fails", [("NT", 24, None), ("TN", 24, "A"), ("NN", 24, "B"), ("TN", 32, None)])
def test_fp8_leading_dims_follow_the_layout_read_on_sm100(te, monkeypatch, layout, k, fails) -> None:
    """sm100 reads per-tensor FP8 in any layout (CanonicalizeGemmInput): A's leading dim is k transposed, else m;
    B's is n transposed, else k. A wgrad (NT) over 24 rows has leading dims 32 and 48 there; sm90's TN reads need
    k itself (test_fp8_k_not_divisible_by_16_raises)."""
    from te_verify.te.tecpu import device
    monkeypatch.setattr(device, "non_tn_fp8_gemm", lambda: True)
    a, b, _ = operands(layout, m=48, n=32, k=k)
    qa, qb = fp8(te, a, 1.0), fp8(te, b, 1.0)
    if fails:
        with pytest.raises(RuntimeError, match=f"Leading dimension requirement on {fails} for FP8 GEMM"):
            te.gemm(qa, qb, out_dtype=torch.float32, layout=layout, grad=layout != "TN")
        return
    out, *_ = te.gemm(qa, qb, out_dtype=torch.float32, layout=layout, grad=layout != "TN")
    want = reference(qa.dequantize(dtype=torch.float32), qb.dequantize(dtype=torch.float32), layout)
    assert_equal(out, want, f"FP8 {layout} GEMM at sm100 vs product of dequantized operands")
