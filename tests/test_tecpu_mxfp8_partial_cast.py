"""tex.mxfp8_scaling_compute_partial_amax and mxfp8_scaling_partial_cast (common/recipe/mxfp8_scaling.cu) against the
whole-tensor MXFP8 quantization: a weight split into contiguous shards at offsets that cut 32-element blocks and
rows, each shard's partial amax (into padded buffers, as cast_master_weights_to_fp8 allocates them) combined by max
(the all-reduce) equals the weight's block amaxes written from the definition (max |x| per 1x32 / 32x1 block, NaN
skipped, inf kept); the E8M0 scales multi_tensor_compute_scale_inv_e8m0 makes of them (bf16: TE's kernel takes no other amax) equal
the whole quantization's;
the shards cast with them and put end to end equal the whole quantization's rowwise and columnwise bytes (NaN of both
signs, inf, -0, values near the scale's bounds included). One shard's buffers, filled with a sentinel first, hold
zeros for the grid's blocks it does not touch and the sentinel past the grid. Planted faults (E4M3 without
satfinite, untouched blocks not zeroed, the shard shifted by one element) each fail the check their clean twin
passes."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import mxfp8, mxfp8_partial_cast

SENTINEL = 7.0
ROWS, COLS = 64, 160  # 160: the last 128-column tile half outside the weight
OFFSETS = [0, 31, 1000, 5000, 5001, ROWS * COLS]  # shard boundaries (one of a single element)


@pytest.fixture(scope="module")
def tex() -> types.ModuleType:
    tecpu.boot()
    import transformer_engine_torch

    return transformer_engine_torch


def weight(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(ROWS, COLS, generator=g) * torch.exp2(torch.randint(-12, 12, (ROWS, COLS // 32), generator=g)
                                                         ).repeat_interleave(32, 1)
    w[3, 5], w[40, 100], w[7, 0], w[50, 33] = float("nan"), -float("nan"), float("inf"), -0.0
    w[9, 64:96] = 0.0  # an all-zero row block: scale 2^-127 side
    return w.to(dtype)


def padded(rows: int, cols: int, dtype: torch.dtype, fill: float = 0.0) -> torch.Tensor:
    """A buffer of the shape TE pads amax and scale buffers to (rows to 128 / cols to 4, or 4 / 128)."""
    return torch.full((rows, cols), fill, dtype=dtype)


def rowwise_shape() -> tuple[int, int]:
    return -(-ROWS // 128) * 128, -(-(COLS // 32) // 4) * 4


def colwise_shape() -> tuple[int, int]:
    return -(-(ROWS // 32) // 4) * 4, -(-COLS // 128) * 128


def block_amax(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """max |x| of each 1x32 and 32x1 block of the weight, NaN skipped (fmaxf from 0), in the data's dtype."""
    a = flat.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a).view(ROWS, COLS)
    return a.view(ROWS, COLS // 32, 32).amax(2), a.view(ROWS // 32, 32, COLS).amax(1)


def check_shards(tex, dtype: torch.dtype) -> None:
    w = weight(dtype)
    flat = w.reshape(-1)
    amax_row, amax_col = padded(*rowwise_shape(), dtype), padded(*colwise_shape(), dtype)
    for lo, hi in zip(OFFSETS, OFFSETS[1:]):
        part_row, part_col = padded(*rowwise_shape(), dtype, SENTINEL), padded(*colwise_shape(), dtype, SENTINEL)
        tex.mxfp8_scaling_compute_partial_amax(flat[lo:hi].clone(), part_row, part_col, ROWS, COLS, lo)
        shard_only = torch.zeros_like(flat)
        shard_only[lo:hi] = flat[lo:hi]
        want_row, want_col = padded(*rowwise_shape(), dtype, SENTINEL), padded(*colwise_shape(), dtype, SENTINEL)
        tiles = -(-COLS // 128)
        want_row[:ROWS, :tiles * 4], want_col[:ROWS // 32, :tiles * 128] = 0, 0  # the kernel's grid
        want_row[:ROWS, :COLS // 32], want_col[:ROWS // 32, :COLS] = block_amax(shard_only)
        assert torch.equal(part_row, want_row), f"shard {lo}..{hi}: rowwise partial amax"
        assert torch.equal(part_col, want_col), f"shard {lo}..{hi}: columnwise partial amax"
        amax_row, amax_col = torch.maximum(amax_row, part_row), torch.maximum(amax_col, part_col)
    whole_row, whole_col = block_amax(flat)
    assert torch.equal(amax_row[:ROWS, :COLS // 32], whole_row), "combined rowwise amax"
    assert torch.equal(amax_col[:ROWS // 32, :COLS], whole_col), "combined columnwise amax"

    data_row, e_row = mxfp8.quantize(w, torch.float8_e4m3fn, columnwise=False)
    data_col, e_col = mxfp8.quantize(w, torch.float8_e4m3fn, columnwise=True)
    scale_row, scale_col = padded(*rowwise_shape(), torch.uint8), padded(*colwise_shape(), torch.uint8)
    if dtype == torch.bfloat16:  # TE's E8M0 kernel takes bf16 amaxes only ("amax should be bf16")
        tex.multi_tensor_compute_scale_inv_e8m0(2048 * 32, None, [[amax_row, amax_col], [scale_row, scale_col]])
        assert torch.equal(scale_row[:ROWS, :COLS // 32], e_row), "rowwise scales of the combined amax"
        assert torch.equal(scale_col[:ROWS // 32, :COLS], e_col), "columnwise scales of the combined amax"
    else:
        scale_row[:ROWS, :COLS // 32], scale_col[:ROWS // 32, :COLS] = e_row, e_col

    out_row, out_col = [], []
    for k, (lo, hi) in enumerate(zip(OFFSETS, OFFSETS[1:])):
        out_dtype = torch.uint8 if k % 2 else torch.float8_e4m3fn  # the kernel takes either
        row, col = torch.full((hi - lo,), 0x55, dtype=torch.uint8), torch.full((hi - lo,), 0x55, dtype=torch.uint8)
        tex.mxfp8_scaling_partial_cast(flat[lo:hi].clone(), row.view(out_dtype), col.view(out_dtype), scale_row,
                                       scale_col, ROWS, COLS, lo)
        out_row.append(row), out_col.append(col)
    for got, want, what in ((torch.cat(out_row), data_row, "rowwise"), (torch.cat(out_col), data_col, "columnwise")):
        bad = (got != want.reshape(-1)).nonzero().flatten().tolist()
        assert not bad, f"{what} bytes of the shards differ from the whole quantization at {bad[:5]} ({len(bad)})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_shards_against_the_whole_quantization(tex, dtype) -> None:
    check_shards(tex, dtype)


def test_chunked_rows_give_the_same_bytes(tex, monkeypatch) -> None:
    """The emulation works through the weight 32 rows at a time when told to (memory only): same results."""
    monkeypatch.setattr(mxfp8_partial_cast, "CHUNK_ELEMENTS", 1)
    check_shards(tex, torch.bfloat16)


def _plant(monkeypatch, fault: str) -> None:
    module = mxfp8_partial_cast
    if fault == "E4M3 without satfinite":
        plain = types.SimpleNamespace(quantize=lambda x, scale, dtype: (x.float() * scale).to(dtype))
        monkeypatch.setattr(module, "fp8", plain)
    elif fault == "untouched blocks not zeroed":
        clean_write = module.write
        monkeypatch.setattr(module, "write", lambda dst, v: clean_write(dst, v) if torch.is_tensor(v) else dst)
    elif fault == "shard shifted by one element":
        clean_chunks = module._chunks
        monkeypatch.setattr(module, "_chunks", lambda *a: ((r0, v.reshape(-1).roll(1).view(v.shape), lo, hi)
                                                           for r0, v, lo, hi in clean_chunks(*a)))


@pytest.mark.parametrize("fault, culprit", [(None, None), ("E4M3 without satfinite", "rowwise bytes"),
                                            ("untouched blocks not zeroed", "rowwise partial amax"),
                                            ("shard shifted by one element", "partial amax")])
def test_planted_fault_is_caught(tex, monkeypatch, fault, culprit) -> None:
    _plant(monkeypatch, fault)
    if fault is None:
        check_shards(tex, torch.bfloat16)
        return
    with pytest.raises(AssertionError, match=culprit):
        check_shards(tex, torch.bfloat16)


def test_checks(tex) -> None:
    x = torch.zeros(64)
    amax_row, amax_col = padded(128, 4, torch.float32), padded(4, 128, torch.float32)
    with pytest.raises(RuntimeError, match="rows must be divisible by 32"):
        tex.mxfp8_scaling_compute_partial_amax(x, amax_row, amax_col, 48, 64, 0)
    with pytest.raises(RuntimeError, match="Invalid start_offset"):
        tex.mxfp8_scaling_compute_partial_amax(x, amax_row, amax_col, 32, 32, 1000)
    with pytest.raises(RuntimeError, match="Wrong padding of amax_rowwise's rows"):
        tex.mxfp8_scaling_compute_partial_amax(x, padded(64, 4, torch.float32), amax_col, 32, 64, 0)
    with pytest.raises(RuntimeError, match="Wrong dtype of amax_colwise"):
        tex.mxfp8_scaling_compute_partial_amax(x, amax_row, amax_col.half(), 32, 64, 0)
    with pytest.raises(tecpu.Unemulated, match="empty grid"):
        tex.mxfp8_scaling_compute_partial_amax(torch.zeros(0), amax_row, amax_col, 0, 64, 0)
    with pytest.raises(RuntimeError, match="input must be contiguous"):
        tex.mxfp8_scaling_compute_partial_amax(torch.zeros(128)[::2], amax_row, amax_col, 32, 64, 0)
    out = torch.empty(64, dtype=torch.uint8)
    scales = padded(128, 4, torch.uint8), padded(4, 128, torch.uint8)
    with pytest.raises(RuntimeError, match="output_colwise should be e4m3 or uint8"):
        tex.mxfp8_scaling_partial_cast(x, out, out.view(torch.int8), *scales, 32, 64, 0)
    with pytest.raises(RuntimeError, match="Size of input and output_rowwise mismatch"):
        tex.mxfp8_scaling_partial_cast(x, out[:8], out, *scales, 32, 64, 0)
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        tex.mxfp8_scaling_partial_cast(x.double(), out, out, *scales, 32, 64, 0)
