"""The reference's FP8 emulation: bit-exact with torch's float8 casts, saturating, TE's scale rule and shape errors."""
import pytest
import torch

from te_verify.te.reference import DelayedScaling, Float8CurrentScaling, Format
from te_verify.te.reference.fp8 import FP8_MAX, TensorScaler, assert_fp8_dims, dequantize, quantize, scale_from_amax

DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _edge_values(dtype: torch.dtype) -> torch.Tensor:
    fi = torch.finfo(dtype)
    sub = fi.smallest_normal / 4  # a subnormal of the format
    vals = [0.0, -0.0, sub, -sub, fi.smallest_normal, fi.max, -fi.max, fi.max * 0.999, 1.0, -1.0, 0.1, 3.3e-3]
    return torch.tensor(vals, dtype=torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_matches_torch_cast_bitwise(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4096, generator=gen) * 50, _edge_values(dtype)])
    x = x.clamp(-FP8_MAX[dtype], FP8_MAX[dtype])  # in range: quantize must be exactly torch's cast
    got = quantize(x, torch.ones(()), dtype)
    assert torch.equal(got.view(torch.uint8), x.to(dtype).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_saturates_to_max(dtype):
    x = torch.tensor([1e9, -1e9, FP8_MAX[dtype] * 1.5, float("inf")])
    got = quantize(x, torch.ones(()), dtype).float()
    assert got.tolist() == [FP8_MAX[dtype], -FP8_MAX[dtype], FP8_MAX[dtype], FP8_MAX[dtype]]


def test_dequantize_roundtrip_with_scale():
    x = torch.tensor([0.5, -2.0, 7.0])
    scale = torch.tensor(4.0)
    assert torch.equal(dequantize(quantize(x, scale, torch.float8_e4m3fn), scale.reciprocal()), x)


def test_scale_rule_margin_and_zero_amax():
    prev = torch.tensor(3.0)
    assert scale_from_amax(torch.tensor(448.0), 448.0, 0, prev) == 1.0
    assert scale_from_amax(torch.tensor(448.0), 448.0, 1, prev) == 0.5
    assert scale_from_amax(torch.tensor(0.0), 448.0, 0, prev) == 3.0
    assert scale_from_amax(torch.tensor(float("inf")), 448.0, 0, prev) == 3.0


def test_delayed_scaling_uses_history_current_uses_now():
    x = torch.full((16, 16), 2.0)
    delayed = TensorScaler(DelayedScaling(amax_history_len=4), torch.float8_e4m3fn, torch.device("cpu"))
    first = delayed.quantize(x)
    assert first.scale_inv == 1.0  # no history yet: scale 1
    delayed.update()
    assert delayed.quantize(x).scale_inv == pytest.approx(2.0 / 448.0)
    current = TensorScaler(Float8CurrentScaling(), torch.float8_e4m3fn, torch.device("cpu"))
    assert current.quantize(x).scale_inv == pytest.approx(2.0 / 448.0)


def test_hybrid_format_uses_e5m2_for_gradients():
    assert Format.HYBRID.fwd_dtype == torch.float8_e4m3fn and Format.HYBRID.bwd_dtype == torch.float8_e5m2


def test_shapes_fp8_refuses_raise_like_te():
    assert_fp8_dims(torch.empty(16, 32))
    with pytest.raises(AssertionError, match="divisible by 8 and width divisible by 16"):
        assert_fp8_dims(torch.empty(16, 24))


@pytest.mark.parametrize("margin", (0, 1))
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_is_the_correctly_rounded_fp32_quotient(dtype, margin):
    """TE's scale (recipe_common.cuh compute_scale_from_amax: `__fdiv_rn(max_fp8, amax)`; delayed scaling's update
    `scaled_max / amax`) is one round-to-nearest fp32 division. The fp64 quotient rounded to fp32 is that division's
    result (53 >= 2 x 24 + 2 bits). torch's `float / tensor` is a reciprocal times the float, two roundings, which
    the reference once took and which misses the last bit of about one scale in five here."""
    gen = torch.Generator().manual_seed(0)
    amax = torch.exp(torch.randn(4096, generator=gen) * 4).float()
    want = (FP8_MAX[dtype] / amax.double() / 2 ** margin).float()
    assert torch.equal(scale_from_amax(amax, FP8_MAX[dtype], margin, torch.ones(())), want)


def test_fp8_gemm_scales_the_sum_of_fp8_products():
    """TE's FP8 GEMM (cuBLAS) sums the products of the FP8 values in fp32 and scales the sum by scale_inv_x x
    scale_inv_w; under current scaling (scales no power of 2) dequantizing each operand first, as the reference once
    did, rounds every element once more and differs in the last bits. Written from the recipe: each operand's scale
    the fp32 quotient 448 / amax, the values torch's saturating cast."""
    from te_verify.te import api as te_api

    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 64, generator=gen), torch.randn(32, 64, generator=gen) * 0.1
    impl = te_api.quantized_reference()
    with te_api.using(impl):
        linear = impl.api.Linear(64, 32, bias=False, params_dtype=torch.float32, device="cpu")
        with torch.no_grad():
            linear.weight.copy_(w)
        with impl.api.autocast(enabled=True, recipe=impl.api.Float8CurrentScaling()):
            got = linear(x)
    scales = [(448.0 / t.abs().max().double()).float() for t in (x, w)]
    xq, wq = ((t * s).clamp(-448, 448).to(torch.float8_e4m3fn).float() for t, s in zip((x, w), scales))
    assert torch.equal(got, (xq @ wq.t()) * (scales[0].reciprocal() * scales[1].reciprocal()))
