"""0-D (scalar) tensors (and tex.create_empty_quantized_tensor) through TE's own quantizers over the tex emulation, at the default emulated sm90 (columnwise
usage makes a transposed copy). TE's C++ reads a 0-D shape as 1x1 (csrc/common.cpp get_2d_dims) and keeps the
transposed copy 0-D (quantizer.cpp make_transpose_shape), so a scalar is one element with one scale, in both copies,
and dequantizes to a 0-D tensor of the requested dtype. Expected bytes from the recipes' definitions, by hand:
- delayed scaling, scale 2: 0.75 -> 1.5, E4M3 0 0111 100 = 0x3C; scale_inv 0.5; dequantized 0.75;
- current scaling: scale = 448 / amax, so the scaled value is E4M3's max 448 (0x7E); dequantized 448 / scale;
- FP8 block scaling (power-of-2 scales by default): 448 / 0.75 = 597.3 rounds down to 512; 0.75 * 512 = 384 =
  1.5 * 2^8, E4M3 0 1111 100 = 0x7C; scale_inv 2^-9; dequantized 0.75 (TE's Python dequantizes these itself)."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import float8_blockwise_tensor, float8_tensor

    return types.SimpleNamespace(delayed=float8_tensor.Float8Quantizer, current=float8_tensor.Float8CurrentScalingQuantizer,
                                 block=float8_blockwise_tensor.Float8BlockQuantizer, E4M3=tex.DType.kFloat8E4M3)


def assert_scalar(got: torch.Tensor, want: float, dtype: torch.dtype, what: str) -> None:
    assert got.shape == torch.Size([]), f"{what}: shape {list(got.shape)}, a 0-D tensor's is []"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, asked for {dtype}"
    assert float(got) == want, f"{what}: {float(got)!r}, want {want!r}"


def assert_byte(buffer: torch.Tensor | None, want: int, what: str) -> None:
    assert buffer is not None, f"{what}: no buffer, the usage asked for one"
    assert buffer.shape == torch.Size([]), f"{what}: shape {list(buffer.shape)}, a 0-D tensor's copy is []"
    assert int(buffer) == want, f"{what}: byte {int(buffer):#04x}, want {want:#04x}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_delayed_scaling_scalar_with_transposed_copy(te, dtype: torch.dtype) -> None:
    q = te.delayed(torch.tensor([2.0]), torch.tensor([0.0]), te.E4M3, rowwise=True, columnwise=True)
    qx = q(torch.tensor(0.75, dtype=dtype))
    assert_byte(qx._data, 0x3C, "rowwise data")
    assert_byte(qx._transpose, 0x3C, "transposed data")
    assert float(qx._scale_inv) == 0.5 and float(q.amax) == 0.75, f"scale_inv {qx._scale_inv}, amax {q.amax}"
    assert_scalar(qx.dequantize(dtype=dtype), 0.75, dtype, "dequantized")


@pytest.mark.parametrize("dtype", DTYPES)
def test_current_scaling_scalar_with_transposed_copy(te, dtype: torch.dtype) -> None:
    q = te.current(te.E4M3, torch.device("cpu"), rowwise=True, columnwise=True)
    qx = q(torch.tensor(-0.75, dtype=dtype))
    scale = torch.tensor(448.0) / torch.tensor(0.75)
    assert_byte(qx._data, 0xFE, "rowwise data")  # -448
    assert_byte(qx._transpose, 0xFE, "transposed data")
    want = float((torch.tensor(-448.0) * torch.reciprocal(scale)).to(dtype))
    assert_scalar(qx.dequantize(dtype=dtype), want, dtype, "dequantized")


def test_transposed_copy_alone_dequantizes_to_a_scalar(te) -> None:
    """Only the transposed copy (columnwise usage): tex.dequantize reads it back, still 0-D."""
    q = te.delayed(torch.tensor([2.0]), torch.tensor([0.0]), te.E4M3, rowwise=False, columnwise=True)
    qx = q(torch.tensor(0.75))
    assert qx._data is None, "rowwise data made without rowwise usage"
    assert_scalar(qx.dequantize(), 0.75, torch.float32, "dequantized from the transposed copy")


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_scaling_scalar_with_columnwise_copy(te, dtype: torch.dtype, block_dim: int) -> None:
    q = te.block(te.E4M3, rowwise=True, columnwise=True, block_scaling_dim=block_dim)
    qx = q(torch.tensor(0.75, dtype=dtype))
    assert_byte(qx._rowwise_data, 0x7C, "rowwise data")
    assert_byte(qx._columnwise_data, 0x7C, "columnwise data")
    for name in ("_rowwise_scale_inv", "_columnwise_scale_inv"):
        assert float(getattr(qx, name).reshape(-1)[0]) == 2.0 ** -9, f"{name}: {getattr(qx, name)}"
    assert_scalar(qx.dequantize(dtype=dtype), 0.75, dtype, "dequantized")


def test_make_empty_allocates_through_tex_as_create_tensor_does(te) -> None:
    """QuantizedTensor.make_empty calls tex.create_empty_quantized_tensor (TE >= 2.16): the quantizer's own buffers,
    a scalar's 0-D, and the tensor class (not the storage) for a quantizer that is not internal."""
    q = te.delayed(torch.tensor([4.0]), torch.tensor([0.0]), te.E4M3, rowwise=True, columnwise=True)
    empty = q.make_empty([], dtype=torch.bfloat16, device="cpu")
    assert type(empty).__name__ == "Float8Tensor" and empty.dtype == torch.bfloat16, f"{type(empty)} {empty.dtype}"
    assert empty._data.shape == torch.Size([]) and empty._transpose.shape == torch.Size([]), "0-D buffers"
    assert float(empty._scale_inv) == 0.25, f"scale_inv {empty._scale_inv}: create_tensor takes 1 / scale"
    block = te.block(te.E4M3, rowwise=True, columnwise=True, block_scaling_dim=1).make_empty([3, 256], device="cpu")
    assert (tuple(block._rowwise_data.shape), tuple(block._columnwise_data.shape)) == ((3, 256), (256, 3)), \
        f"block buffers {block._rowwise_data.shape}, {block._columnwise_data.shape}"
