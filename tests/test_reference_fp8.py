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
