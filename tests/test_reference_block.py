"""The same-quantization reference's block formats (te.reference.block, written from the formats' definitions) give
the same operand values as the tex emulation's quantizers (written from TE's kernels) on random tensors with a
zero block and values past the format's range; a scale rounded the wrong way shows."""
import pytest
import torch

from te_verify.te.fp8 import FP8_MAX, quantize as fp8_cast
from te_verify.te.reference import block
from te_verify.te.tecpu import block_fp8, mxfp8, nvfp4


def _x(rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 3, cols).repeat(rows, 1)
    x[0, :32] = 0.0  # a block whose amax is 0
    return x


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mxfp8_matches_the_emulation(dtype):
    x = _x(64, 128)
    values, scale = block.mxfp8(x, dtype)
    data, e = mxfp8.quantize(x, dtype, columnwise=False)
    assert torch.equal(values * scale, mxfp8.dequantize(data, e, dtype, columnwise=False))


@pytest.mark.parametrize("two_d", [False, True])
def test_fp8_block_matches_the_emulation(two_d):
    x = _x(256, 256)
    values, scale_inv = block.fp8_block(x, torch.float8_e4m3fn, two_d)
    data, s = block_fp8.quantize(x, torch.float8_e4m3fn, two_d, pow2=True, epsilon=0.0)
    assert torch.equal(values * scale_inv, block_fp8.dequantize(data, s, torch.float8_e4m3fn, two_d))


@pytest.mark.parametrize("two_d", [False, True])
def test_nvfp4_matches_the_emulation(two_d):
    x = _x(32, 64) / 100
    amax = x.abs().max()
    values, scale = block.nvfp4(x, amax, two_d)
    data, s = nvfp4.quantize(x, amax, two_d)
    assert torch.equal(values, nvfp4.decode(nvfp4.unpack(data)))  # the same E2M1 elements
    # and the same scales; the two fold the per-tensor factor in another order (an fp32 rounding apart)
    torch.testing.assert_close(values * scale, nvfp4.dequantize(data, s, amax), rtol=2 ** -22, atol=0)


def _floor_rule_mxfp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Planted reference: OCP's floor rule, 2^floor(log2(amax / fp8 max)), not TE's round-up."""
    _, exponent = torch.frexp(block._tiles(x, 1, 32) / FP8_MAX[dtype])
    scale = torch.exp2((exponent - 1).clamp(-127, 127).double()).float()
    return fp8_cast(x.float() / scale, 1.0, dtype).float(), scale


def test_an_mxfp8_scale_rounded_down_differs():
    """The comparison above catches a reference rounding the E8M0 scale the wrong way: where amax / 448 is not a
    power of two the floor rule saturates the block's largest elements (480 -> 448), TE's rule keeps them."""
    x = torch.full((1, 32), 480.0)
    values, scale = block.mxfp8(x, torch.float8_e4m3fn)
    assert float(scale[0, 0]) == 2.0 and torch.equal(values * scale, x)  # 480 / 448 rounded up to 2^1
    planted_values, planted_scale = _floor_rule_mxfp8(x, torch.float8_e4m3fn)
    assert float(planted_scale[0, 0]) == 1.0 and float(planted_values[0, 0]) == 448.0
    x = _x(64, 128)
    data, e = mxfp8.quantize(x, torch.float8_e4m3fn, columnwise=False)
    emulated = mxfp8.dequantize(data, e, torch.float8_e4m3fn, columnwise=False)
    planted_values, planted_scale = _floor_rule_mxfp8(x, torch.float8_e4m3fn)
    differing = (planted_values * planted_scale != emulated).sum()
    assert differing > 0, "the floor-rule reference matched the emulation on every element"


def test_hadamard_matches_the_emulation_under_te_matrix():
    """The reference's RHT (Sylvester's H16 and the documented signs) is the transform the emulation applies with
    the matrix TE's NVFP4Quantizer builds (get_rht_matrix with the random sign mask)."""
    from te_verify.te import api as te_api
    from te_verify.te.tecpu import te_import

    booted = te_import.booted()  # the matrix does not depend on the capability: boot as this process already is
    impl = te_api.resolve("transformer_engine_cpu", booted.capability if booted else "sm90")
    with te_api.using(impl):
        impl.api  # noqa: B018 -- boots TE's Python over the emulation
        from transformer_engine.pytorch.tensor.nvfp4_tensor import get_rht_matrix

        rht = get_rht_matrix(True, device="cpu")
    y = _x(32, 64).to(torch.bfloat16)
    assert torch.equal(block.hadamard(y), nvfp4.hadamard(y, rht))
