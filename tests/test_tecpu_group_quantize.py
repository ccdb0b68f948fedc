"""tex.group_quantize / bgrad_group_quantize / group_dequantize over the emulation (te/tecpu/group_quantize.py),
from cast.cpp's definition: each group of the packed input is quantized as the per-tensor quantizer quantizes it
alone, so the packed buffers are the per-tensor results concatenated in group order (TE's test_grouped_tensor checks
the same); current scaling's per-group amax and scale land in the storage (an empty group's 1 / scale too); the bias
gradient is each group's column sums; dequantizing gives each group's per-tensor dequantized values. The emulated
device is sm90 here (MXFP8 and NVFP4 quantize at sm100: TE's own test file runs them, docs/te-lane.md)."""
import types

import pytest
import torch

from te_verify.te import tecpu

SPLITS = [32, 0, 64, 16]


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    def current():
        q = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, device="cpu")
        q.set_usage(rowwise=True, columnwise=False)
        return q

    def block():
        return Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False, block_scaling_dim=1)

    return types.SimpleNamespace(tex=tex, current=current, block=block)


def _groups(cols: int = 128):
    g = torch.Generator().manual_seed(5)
    parts = [torch.randn(rows, cols, generator=g).to(torch.bfloat16) * (i + 1) for i, rows in enumerate(SPLITS)]
    return parts, torch.cat(parts), torch.tensor(SPLITS, dtype=torch.int64)


@pytest.mark.parametrize("kind", ["current", "block"])
def test_packed_buffers_are_the_per_tensor_results_concatenated(te, kind):
    parts, packed, first_dims = _groups()
    quantizer = getattr(te, kind)()
    grouped = te.tex.group_quantize(packed, quantizer, len(SPLITS), first_dims)
    singles = [getattr(te, kind)()(x) for x in parts if x.numel()]
    data = torch.cat([(q._data if kind == "current" else q._rowwise_data).reshape(-1) for q in singles])
    assert torch.equal(grouped.rowwise_data.reshape(-1), data)
    if kind == "current":
        amax = torch.stack([x.float().abs().max() if x.numel() else torch.zeros(()) for x in parts])
        assert torch.equal(grouped.amax, amax)
        assert torch.allclose(grouped.scale_inv, torch.reciprocal(grouped.scale), rtol=0, atol=0)
        kept = [i for i, x in enumerate(parts) if x.numel()]
        assert torch.equal(grouped.scale_inv[kept], torch.cat([q._scale_inv.reshape(1) for q in singles]))
    else:
        assert torch.equal(grouped.scale_inv.reshape(-1),
                           torch.cat([q._rowwise_scale_inv.reshape(-1) for q in singles]))


def test_bias_gradient_is_each_groups_column_sums(te):
    parts, packed, first_dims = _groups()
    _, dbias = te.tex.bgrad_group_quantize(packed, te.block(), len(SPLITS), first_dims)
    want = torch.stack([x.float().sum(0) for x in parts]).to(torch.bfloat16)
    assert dbias.dtype == torch.bfloat16 and torch.equal(dbias, want)


def test_group_dequantize_gives_each_groups_dequantized_values(te):
    parts, packed, first_dims = _groups()
    grouped = te.tex.group_quantize(packed, te.current(), len(SPLITS), first_dims)
    out = te.tex.group_dequantize(grouped, te.tex.DType.kFloat32)
    want = torch.cat([te.current()(x).dequantize(dtype=torch.float32).reshape(-1) for x in parts if x.numel()])
    assert torch.equal(out.rowwise_data.reshape(-1), want)


@pytest.mark.parametrize("call, message", [
    (lambda te: te.tex.group_quantize(torch.zeros(2, 4, 8), te.current(), 2), "Tensor must be 2D"),
    (lambda te: te.tex.bgrad_group_quantize(torch.zeros(4, 8), te.block(), 2, None, torch.tensor([4, 4])),
     "varying last dim is not supported"),
    (lambda te: te.tex.bgrad_group_quantize(torch.zeros(4, 8), te.current(), 2), "only MXFP8 and FP8 block-scaling"),
])
def test_what_cast_cpp_refuses_raises_its_error(te, call, message):
    with pytest.raises(RuntimeError, match=message):
        call(te)
