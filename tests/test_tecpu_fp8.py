"""Per-tensor FP8 quantization through TE's own quantizers (Float8Quantizer, Float8CurrentScalingQuantizer) over
the tex emulation: bytes identical to te_verify.te.fp8.quantize and to torch's float8 casts (saturating to the
largest finite value out of range), delayed scaling's amax update, current scaling's scale rule
(common/recipe/recipe_common.cuh compute_scale_from_amax, called by nvte_compute_scale_from_amax with
value_for_inf = FLT_MAX in current_scaling.cu) and the tex.dequantize round trip."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import fp8
from te_verify.te import tecpu
from te_verify.te.tecpu import quantize as tq

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
DTYPES = [pytest.param(E4M3, id="e4m3"), pytest.param(E5M2, id="e5m2")]
FP32_MAX = torch.finfo(torch.float32).max
SUBNORMAL_MIN = {E4M3: 2.0 ** -9, E5M2: 2.0 ** -16}
MAX_BYTES = {E4M3: (0x7E, 0xFE), E5M2: (0x7B, 0xFB)}  # +max, -max: 448 = S.1111.110, 57344 = S.11110.11


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_tensor

    return types.SimpleNamespace(tex=tex, delayed=float8_tensor.Float8Quantizer,
                                 current=float8_tensor.Float8CurrentScalingQuantizer,
                                 dtype={E4M3: tex.DType.kFloat8E4M3, E5M2: tex.DType.kFloat8E5M2})


def delayed(te: types.SimpleNamespace, dtype: torch.dtype, scale: float, amax: float = 0.0, **usage: bool):
    return te.delayed(torch.tensor([scale]), torch.tensor([amax]), te.dtype[dtype], **usage)


def current(te: types.SimpleNamespace, dtype: torch.dtype, **kwargs):
    return te.current(te.dtype[dtype], torch.device("cpu"), **kwargs)


def as_bytes(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return fp8.quantize(x, torch.tensor(scale, dtype=torch.float32), dtype).view(torch.uint8)


def assert_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    bad = (got != want).nonzero()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert bad.numel() == 0, (f"{what}: {bad.shape[0]} bytes differ, first at {bad[0].tolist()}: "
                              f"{int(got[tuple(bad[0])])} != {int(want[tuple(bad[0])])}")


def specials(dtype: torch.dtype) -> torch.Tensor:
    """±0, subnormals (exact, halfway-to-even, rounding up), ±max, just above max, overflow, ±inf."""
    s, m = SUBNORMAL_MIN[dtype], fp8.FP8_MAX[dtype]
    return torch.tensor([0.0, -0.0, s, -s, 3 * s, s / 2, 0.75 * s, m, -m, 1.01 * m, 2 * m, -2 * m, 1e30,
                         float("inf"), float("-inf")], dtype=torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.375, 64.0])
def test_delayed_rowwise_transpose_and_scale_inv_match_shared_cast(te, dtype: torch.dtype, scale: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 48) * torch.logspace(-3, 3, 48)
    qx = delayed(te, dtype, scale)(x)
    assert_bytes(qx._data, as_bytes(x, scale, dtype), f"rowwise _data ({dtype}, scale {scale})")
    assert qx._transpose is not None, "sm90 with columnwise usage must hold the explicit _transpose"
    assert_bytes(qx._transpose, as_bytes(x.t().contiguous(), scale, dtype), f"_transpose ({dtype}, scale {scale})")
    assert qx._scale_inv.item() == torch.reciprocal(torch.tensor(scale)).item(), f"_scale_inv for scale {scale}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_range_bytes_equal_torch_float8_cast(te, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    scale = 4.0
    x = (torch.rand(64, 32) * 2 - 1) * fp8.FP8_MAX[dtype] / scale  # |x * scale| <= max
    qx = delayed(te, dtype, scale)(x)
    assert_bytes(qx._data, (x * scale).to(dtype).view(torch.uint8), f"rowwise _data vs torch cast ({dtype})")


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_round_and_saturate(te, dtype: torch.dtype) -> None:
    x = torch.cat([specials(dtype), torch.zeros(1)]).repeat(16, 1)  # 16 rows of the 15 specials and a 0
    qx = delayed(te, dtype, 1.0)(x)
    row = qx._data[0]
    m = fp8.FP8_MAX[dtype]
    in_range = x[0].abs() <= m
    assert_bytes(row[in_range], x[0][in_range].to(dtype).view(torch.uint8), f"in-range specials ({dtype})")
    assert int(row[1]) == 0x80, f"-0.0 must keep its sign ({dtype}): got {int(row[1]):#x}"
    assert int(row[2]) == 0x01 and int(row[5]) == 0x00 and int(row[6]) == 0x01, \
        f"subnormals ({dtype}): min -> 0x01, half of min -> 0 (ties to even), 0.75*min -> 0x01; got {row[[2, 5, 6]].tolist()}"
    pos, neg = MAX_BYTES[dtype]
    assert_bytes(row[[7, 9, 10, 12, 13]], torch.full((5,), pos, dtype=torch.uint8),
                 f"max, overflow and +inf saturate to +{m} ({dtype})")
    assert_bytes(row[[8, 11, 14]], torch.full((3,), neg, dtype=torch.uint8),
                 f"-max, negative overflow and -inf saturate to -{m} ({dtype})")
    values = qx.dequantize(dtype=torch.float32)
    assert torch.isfinite(values).all(), f"saturating cast produced NaN/inf ({dtype}): {values[0].tolist()}"
    assert_bytes(qx._data, as_bytes(x, 1.0, dtype), f"specials vs te_verify.te.fp8.quantize ({dtype})")


def test_transpose_of_3d_input_puts_last_dim_first(te) -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 8, 16)
    qx = delayed(te, E4M3, 2.0)(x)
    want = as_bytes(x.reshape(-1, 16).t().contiguous(), 2.0, E4M3).reshape(16, 2, 8)
    assert_bytes(qx._transpose, want, "3-D _transpose (make_transpose_shape: last dim first)")


def test_usage_decides_buffers_on_sm90(te) -> None:
    x = torch.randn(16, 16)
    row_only = delayed(te, E4M3, 1.0, rowwise=True, columnwise=False)(x)
    col_only = delayed(te, E4M3, 1.0, rowwise=False, columnwise=True)(x)
    assert row_only._data is not None and row_only._transpose is None, "rowwise-only: _data and no _transpose"
    assert col_only._data is None and col_only._transpose is not None, "columnwise-only on sm90: only _transpose"


@pytest.mark.parametrize("dtype", DTYPES)
def test_delayed_scaling_amax_is_running_max(te, dtype: torch.dtype) -> None:
    q = delayed(te, dtype, 1.0, amax=5.0)
    q(torch.full((16, 16), -3.0))
    assert q.amax.item() == 5.0, f"amax after max|x|=3 over previous 5: {q.amax.item()}"
    x = torch.zeros(16, 16)
    x[3, 7] = -7.5
    q(x)
    assert q.amax.item() == 7.5, f"amax after max|x|=7.5 over previous 5: {q.amax.item()}"


def nan_input() -> torch.Tensor:
    x = torch.full((16, 16), 2.0)
    x[0, 0] = float("nan")
    return x


# TE's cast kernels reduce amax with fmaxf(fabsf(v), amax) (transpose/cast_transpose.cu:165,
# util/vectorized_pointwise.h:202, recipe/current_scaling.cu amax_kernel): fmaxf drops a NaN operand.
def test_nan_element_does_not_enter_delayed_amax(te) -> None:
    q = delayed(te, E4M3, 1.0, amax=1.0)
    q(nan_input())
    assert q.amax.item() == 2.0, f"delayed-scaling amax with a NaN element: {q.amax.item()} (CUDA: 2.0)"


def test_nan_element_does_not_enter_current_scale(te) -> None:
    qx = current(te, E4M3)(nan_input())
    want = torch.reciprocal(torch.tensor(224.0)).item()
    assert qx._scale_inv.item() == want, f"current-scaling scale_inv with a NaN element: {qx._scale_inv.item()} (CUDA: 1/224)"


# (x's amax, dtype, force_pow_2, epsilon, expected scale): hand-computed from recipe_common.cuh.
CURRENT_CASES = [
    pytest.param(2.0, E4M3, False, 0.0, 224.0, id="448/2"),
    pytest.param(2.0, E5M2, False, 0.0, 28672.0, id="57344/2"),
    pytest.param(0.0, E4M3, False, 0.0, 1.0, id="zero-amax->1"),
    pytest.param(3.0, E4M3, True, 0.0, 128.0, id="pow2(149.33)->128"),
    pytest.param(3.0, E5M2, True, 0.0, 16384.0, id="pow2(19114.67)->16384"),
    pytest.param(0.0, E4M3, False, 0.5, 896.0, id="zero-amax-floored-at-eps"),
    pytest.param(1e-6, E4M3, False, 1e-3, float(torch.tensor(448.0) / torch.tensor(1e-3)), id="eps-floor"),
    pytest.param(1e-39, E4M3, False, 0.0, FP32_MAX, id="inf-scale->fp32max"),
    pytest.param(1e-39, E4M3, True, 0.0, 2.0 ** 127, id="fp32max-pow2->2^127"),
]


@pytest.mark.parametrize("amax, dtype, pow2, eps, scale", CURRENT_CASES)
def test_current_scaling_scale_rule(te, amax: float, dtype: torch.dtype, pow2: bool, eps: float, scale: float) -> None:
    x = torch.zeros(16, 16)
    x[5, 9] = -amax
    x[1, 2] = amax / 2
    qx = current(te, dtype, force_pow_2_scales=pow2, amax_epsilon=eps)(x)
    want_inv = torch.reciprocal(torch.tensor(scale, dtype=torch.float32)).item()
    assert qx._scale_inv.item() == want_inv, f"scale_inv for amax {amax}: {qx._scale_inv.item()} != 1/{scale}"
    assert_bytes(qx._data, as_bytes(x, scale, dtype), f"current-scaling _data (amax {amax})")
    assert_bytes(qx._transpose, as_bytes(x.t().contiguous(), scale, dtype), f"current-scaling _transpose (amax {amax})")


def test_current_scaling_bf16_input_infinite_scale_is_fp32_max(te) -> None:
    """nvte_compute_scale_from_amax passes value_for_inf = std::numeric_limits<float>::max() whatever the input
    dtype (current_scaling.cu compute_scale_from_amax_kernel), not the input dtype's max."""
    x = torch.zeros(16, 16, dtype=torch.bfloat16)
    x[0, 0] = 1e-38
    qx = current(te, E4M3)(x)
    want = torch.reciprocal(torch.tensor(FP32_MAX)).item()
    assert qx._scale_inv.item() == want, f"bf16 input, infinite scale: scale_inv {qx._scale_inv.item()} != 1/FLT_MAX {want}"


@pytest.mark.parametrize("amax, max_fp8, pow2, eps, scale", [
    (2.0, 448.0, False, 0.0, 224.0), (float("inf"), 448.0, False, 0.0, 1.0), (float("nan"), 448.0, False, 0.0, 1.0),
    (0.0, 448.0, False, 0.0, 1.0), (0.0, 448.0, False, 0.25, 1792.0), (1e-45, 448.0, False, 0.0, FP32_MAX),
    (1e-45, 448.0, True, 0.0, 2.0 ** 127), (5.0, 57344.0, True, 0.0, 8192.0), (448.0, 448.0, True, 0.0, 1.0),
])
def test_compute_scale_from_amax_matches_recipe_common(amax: float, max_fp8: float, pow2: bool, eps: float,
                                                       scale: float) -> None:
    got = tq.compute_scale_from_amax(amax, max_fp8, pow2, eps)
    assert got == scale, f"compute_scale_from_amax({amax}, {max_fp8}, pow2={pow2}, eps={eps}) = {got}, want {scale}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("otype", [torch.float32, torch.bfloat16])
def test_dequantize_round_trip(te, dtype: torch.dtype, otype: torch.dtype) -> None:
    torch.manual_seed(3)
    x = torch.randn(16, 32)
    for q, label in ((delayed(te, dtype, 8.0), "rowwise"), (delayed(te, dtype, 8.0, rowwise=False), "columnwise-only")):
        qx = q(x)
        got = te.tex.dequantize(qx, te.tex.DType.kFloat32 if otype == torch.float32 else te.tex.DType.kBFloat16)
        want = (fp8.quantize(x, 8.0, dtype).float() * qx._scale_inv).to(otype)
        assert got.dtype == otype and torch.equal(got, want), f"tex.dequantize ({label}, {dtype} -> {otype})"
