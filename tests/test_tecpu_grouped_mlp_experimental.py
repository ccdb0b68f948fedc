"""tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights over the emulation
(te/tecpu/grouped_mlp_experimental.py), from its definition in grouped_mlp_experimental.cpp: each expert's compact
scales swizzled to cuBLAS's layout (swizzle_layout.py's index formula; MXFP8's columnwise scales as their transpose),
the padding written as zeros whatever it held, into one buffer at a 16-byte-aligned uniform stride; the data pointers
and the swizzled scales' pointers packed as int64. A planted fault (the padding swizzled along) is caught. The
emulated device is sm100 here (MXFP8, NVFP4), restored."""
import types

import pytest
import torch

import emulated_device
from swizzle_layout import swizzled_by_index
from te_verify.te import tecpu


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    from te_verify.te.tecpu import block_quantize
    return types.SimpleNamespace(tex=tex, MX=MXFP8Quantizer, NV=NVFP4Quantizer, bq=block_quantize)


@pytest.fixture(autouse=True)
def sm100(te):
    with emulated_device.capability("sm100"):
        yield


def quantizer(te, swizzle_type: str):
    if swizzle_type == "nvfp4":
        return te.NV(columnwise=False, with_rht=False, with_post_rht_amax=False, with_2d_quantization=False,
                     stochastic_rounding=False, with_random_sign_mask=False)
    return te.MX(te.tex.DType.kFloat8E4M3, rowwise=swizzle_type == "mxfp8_rowwise",
                 columnwise=swizzle_type == "mxfp8_columnwise")


def discrete_weights(te, swizzle_type: str, num: int = 3, shape=(160, 96)):
    """Per-expert weights with compact scales, their padding poisoned; (data, scales, the scales zero-padded)."""
    q = quantizer(te, swizzle_type)
    q.optimize_for_gemm = False
    weights = [q(torch.randn(shape, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16))
               for i in range(num)]
    columnwise = swizzle_type == "mxfp8_columnwise"
    data = [w._columnwise_data if columnwise else w._rowwise_data for w in weights]
    scales = [w._columnwise_scale_inv if columnwise else w._rowwise_scale_inv for w in weights]
    rows, cols = (shape[0] // 32, shape[1]) if columnwise else (shape[0], shape[1] // (16 if "nvfp4" in swizzle_type
                                                                                       else 32))
    zero_padded = []
    for scale in scales:
        u = scale.view(torch.uint8)
        zero_padded.append(torch.zeros_like(u))
        zero_padded[-1][:rows, :cols] = u[:rows, :cols]
        u[rows:], u[:, cols:] = 0xFF, 0xFF
    return data, scales, zero_padded


def check_discrete_weights_packed(te, swizzle_type: str = "mxfp8_columnwise") -> None:
    data, scales, zero_padded = discrete_weights(te, swizzle_type)
    helper = te.tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights
    data_ptrs, scale_ptrs, buffer = helper(data, scales, swizzle_type, torch.device("cpu"))
    stride = scales[0].numel()  # 128x4 tiles: already a multiple of 16 bytes
    assert data_ptrs.tolist() == [d.data_ptr() for d in data]
    assert scale_ptrs.tolist() == [buffer.data_ptr() + i * stride for i in range(len(data))]
    columnwise = swizzle_type == "mxfp8_columnwise"
    for i, compact in enumerate(zero_padded):
        want = swizzled_by_index(compact.t() if columnwise else compact)
        assert torch.equal(buffer[i * stride:(i + 1) * stride], want), f"expert {i}: swizzled scales differ"


@pytest.mark.parametrize("swizzle_type", ["mxfp8_rowwise", "mxfp8_columnwise", "nvfp4"])
def test_discrete_weights_swizzled_and_packed(te, swizzle_type) -> None:
    check_discrete_weights_packed(te, swizzle_type)


@pytest.mark.parametrize("args, message", [
    (lambda d, s: (d, s[:1], "mxfp8_rowwise"), "matching sizes"),
    (lambda d, s: (d, s, "mxfp8"), "Unsupported swizzle type"),
    (lambda d, s: (d, [x.reshape(-1) for x in s], "mxfp8_rowwise"), "Expected 2D scale tensor"),
])
def test_discrete_weights_rejected_as_te_rejects(te, args, message) -> None:
    data, scales, _ = discrete_weights(te, "mxfp8_rowwise", num=2)
    helper = te.tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights
    with pytest.raises(RuntimeError, match=message):
        helper(*args(data, scales), torch.device("cpu"))
    assert [t.numel() for t in helper([], [], "nvfp4", torch.device("cpu"))] == [0, 0, 0]


def test_planted_padding_swizzled_along_is_caught(te, monkeypatch) -> None:
    monkeypatch.setattr(te.bq, "compact_scale_dims", lambda kind, shape, columnwise: (1 << 30, 1 << 30))
    with pytest.raises(AssertionError):
        check_discrete_weights_packed(te)
