"""tex.grouped_swizzle_for_gemm and tex.group_requantize_inplace over the emulation (te/tecpu/group_requantize.py),
from their definitions: swizzling moves each group's compact MXFP8 scale (r, c) to cuBLAS's 1D block scaling layout
(swizzle_layout.py's index formula; a columnwise region as its transpose) over its padded region, the padding
written as zeros whatever it held, in a buffer of the input's capacity; requantizing keeps the rowwise bytes,
swizzles their scales and builds the columnwise copy as MXFP8 of the dequantized values in 32x1 blocks (the
definition-based te.reference.block.mxfp8 of the transpose), returning those values (each byte's E4M3 value times
2^(scale - 127)). The index formula and the references are written apart from the emulation's block_scales; each
check also runs against a planted fault it must catch. The emulated device is sm100 here."""
import types

import pytest
import torch

import emulated_device
from swizzle_layout import swizzled_by_index, swizzled_index
from te_verify.te import tecpu
from te_verify.te.reference import block
from te_verify.te.tecpu import block_scales

SPLITS, HIDDEN = [128, 0, 256, 128], 256
PADDED_SPLITS, PADDED_HIDDEN = [96, 0, 160, 64], 192  # scale regions with padding in both dimensions, both directions
E4M3 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    from te_verify.te.tecpu import block_quantize, block_scales, group_quantize, group_requantize
    return types.SimpleNamespace(tex=tex, MX=MXFP8Quantizer, Block=Float8BlockQuantizer,
                                 scales=block_scales, bq=block_quantize, gq=group_quantize, mod=group_requantize)


@pytest.fixture(autouse=True)
def sm100(te):
    with emulated_device.capability("sm100"):
        yield


def quantizer(te, rowwise=True, columnwise=False, gemm_ready=False, dtype=None):
    q = te.MX(dtype or te.tex.DType.kFloat8E4M3, rowwise=rowwise, columnwise=columnwise)
    q.optimize_for_gemm = gemm_ready
    return q


def wire(te, splits=SPLITS, rows=None, columnwise=False, varying=True, hidden=HIDDEN):
    """A grouped MXFP8 tensor with compact scales, as FP8 token dispatch delivers it; its input values."""
    rows = rows or sum(splits)
    x = (torch.randn(rows, hidden, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    first = torch.tensor(splits, dtype=torch.int64) if varying else None
    q = quantizer(te, rowwise=not columnwise, columnwise=columnwise)
    return te.tex.group_quantize(x, q, len(splits), first), x


def regions(te, grouped, columnwise: bool, poison: bool = False) -> list[tuple[int, torch.Tensor]]:
    """(offset in the flat buffer, padded compact region, its padding zero) of each non-empty group's scales; with
    `poison`, the padding in the buffer set to 0xFF first (the swizzle must write zeros there, as TE's kernel)."""
    buffer = grouped.columnwise_scale_inv if columnwise else grouped.scale_inv
    out = []
    for view in te.gq.group_views(grouped):
        region = view._columnwise_scale_inv if columnwise else view._rowwise_scale_inv
        if region is not None and region.numel():
            m, k = (view._columnwise_data if columnwise else view._rowwise_data).shape
            rows, cols = (m // 32, k) if columnwise else (m, k // 32)
            compact = torch.zeros_like(region)
            compact[:rows, :cols] = region[:rows, :cols]
            if poison:
                region[rows:], region[:, cols:] = 0xFF, 0xFF
            out.append((region.storage_offset() - buffer.storage_offset(), compact))
    return out


def layout_failures(buffer: torch.Tensor, before: list[tuple[int, torch.Tensor]], columnwise: bool) -> list[str]:
    flat = buffer.reshape(-1)
    failures = []
    for i, (start, compact) in enumerate(before):
        want = swizzled_by_index(compact.t() if columnwise else compact)
        got = flat[start:start + want.numel()]
        bad = (got != want).nonzero()
        if len(bad):
            failures.append(f"group region {i}: {len(bad)} of {want.numel()} scales misplaced, first at flat "
                            f"{start + int(bad[0])}")
    return failures


def check_swizzle_layout(te, columnwise: bool = False) -> None:
    grouped, _ = wire(te, splits=PADDED_SPLITS, columnwise=columnwise, hidden=PADDED_HIDDEN)
    name = "columnwise_scale_inv" if columnwise else "scale_inv"
    shape, before = getattr(grouped, name).shape, regions(te, grouped, columnwise, poison=True)
    te.tex.grouped_swizzle_for_gemm(grouped, not columnwise, columnwise)
    assert grouped._with_gemm_swizzled_scales and getattr(grouped, name).shape == shape
    assert len(before) == 3 and layout_failures(getattr(grouped, name), before, columnwise) == []


def check_swizzle_columnwise(te) -> None:
    check_swizzle_layout(te, columnwise=True)


def test_uniform_groups_swizzle_into_one_region_per_group(te) -> None:
    grouped, _ = wire(te, splits=[128, 128], varying=False)
    before = regions(te, grouped, False)
    te.tex.grouped_swizzle_for_gemm(grouped, True, False)
    assert tuple(grouped.scale_inv.shape) == (2 * 128, HIDDEN // 32)  # num_tensors * padded rows, padded blocks
    assert layout_failures(grouped.scale_inv, before, False) == []


def test_the_direction_not_asked_for_loses_its_scales(te) -> None:
    grouped, x = wire(te)
    both = te.tex.group_quantize(x, quantizer(te, columnwise=True), len(SPLITS), torch.tensor(SPLITS))
    te.tex.grouped_swizzle_for_gemm(both, True, False)
    assert both.scale_inv is not None and both.columnwise_scale_inv is None


def test_other_formats_and_swizzled_scales_are_left_alone(te) -> None:
    x = torch.randn(256, HIDDEN).to(torch.bfloat16)
    blockwise = te.tex.group_quantize(x, te.Block(te.tex.DType.kFloat8E4M3, rowwise=True, columnwise=False,
                                                  block_scaling_dim=1), 2)
    ready = te.tex.group_quantize(x, quantizer(te, gemm_ready=True), 2)
    for grouped in (blockwise, ready):
        scales = grouped.scale_inv
        te.tex.grouped_swizzle_for_gemm(grouped, True, True)
        assert grouped.scale_inv is scales


def dequantized_by_definition(data: torch.Tensor, scales: torch.Tensor, rows: int) -> torch.Tensor:
    """Each E4M3 byte's value times 2^(its 1x32 block's E8M0 - 127), in bf16."""
    values = data[:rows].view(E4M3).float()
    e = scales[:rows, :HIDDEN // 32].double() - 127
    return (values * torch.exp2(e).float().repeat_interleave(32, 1)).to(torch.bfloat16)


def columnwise_failures(te, grouped, live: torch.Tensor, splits: list[int]) -> list[str]:
    """Each group's columnwise copy against MXFP8 of its dequantized values in 32x1 blocks."""
    failures, row = [], 0
    for i, view in enumerate(te.gq.group_views(grouped)):
        m = splits[i]
        if m:
            values, scale = block.mxfp8(live[row:row + m].float().t().contiguous(), E4M3)
            e = torch.empty(m // 32, HIDDEN, dtype=torch.uint8)
            flat = view._columnwise_scale_inv.reshape(-1)
            for r in range(HIDDEN):  # the transposed region's (r = column, c = block) entries
                for c in range(m // 32):
                    e[c, r] = flat[swizzled_index(r, c, view._columnwise_scale_inv.shape[0])]
            got = view._columnwise_data.view(E4M3).float() * torch.exp2(e.double() - 127).float().repeat_interleave(
                32, 0)
            if not torch.equal(got, (values * scale).t()):
                failures.append(f"group {i}: columnwise copy differs from MXFP8 of its dequantized values")
        row += m
    return failures


def check_requantize(te, rows: int | None = None) -> None:
    grouped, _ = wire(te, rows=rows)
    data, before, live = grouped.rowwise_data.clone(), regions(te, grouped, False), sum(SPLITS)
    compact = [(v._rowwise_scale_inv.clone(), v._rowwise_data.clone()) for v in te.gq.group_views(grouped)]
    out = te.tex.group_requantize_inplace(grouped, quantizer(te, columnwise=True, gemm_ready=True), len(SPLITS),
                                          torch.tensor(SPLITS), te.tex.DType.kBFloat16, return_dequantized=True)
    want = torch.cat([dequantized_by_definition(d, s, m) for (s, d), m in zip(compact, SPLITS)])
    assert torch.equal(out[:live], want), "dequantized values differ from each byte's value times its block scale"
    assert torch.equal(grouped.rowwise_data, data) and grouped._with_gemm_swizzled_scales
    assert layout_failures(grouped.scale_inv, before, False) == []
    assert columnwise_failures(te, grouped, want, SPLITS) == []


def check_requantize_paged(te) -> None:
    check_requantize(te, rows=1024)  # the groups cover 512 of the buffer's 1024 rows


CHECKS = [check_swizzle_layout, check_swizzle_columnwise, check_requantize, check_requantize_paged]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_definition(te, check) -> None:
    check(te)


@pytest.mark.parametrize("fused", ["1", "0"])
def test_only_the_unfused_chain_switches_the_quantizers_rowwise_usage_off(te, monkeypatch, fused) -> None:
    monkeypatch.setenv(te.mod.FUSED_ENV, fused)
    grouped, _ = wire(te)
    q = quantizer(te, columnwise=True, gemm_ready=True)
    te.tex.group_requantize_inplace(grouped, q, len(SPLITS), torch.tensor(SPLITS), te.tex.DType.kBFloat16)
    assert q.rowwise_usage == (fused == "1") and grouped.columnwise_data is not None


def test_frozen_weights_get_no_columnwise_copy(te) -> None:
    grouped, _ = wire(te)
    te.tex.group_requantize_inplace(grouped, quantizer(te), len(SPLITS), torch.tensor(SPLITS), te.tex.DType.kBFloat16)
    assert grouped._with_gemm_swizzled_scales and grouped.columnwise_data is None


def _gemm_ready(te):
    x = torch.randn(256, HIDDEN).to(torch.bfloat16)
    return te.tex.group_quantize(x, quantizer(te, columnwise=True, gemm_ready=True), 2)


def _swizzled_rowwise_only(te):
    grouped, _ = wire(te)
    te.tex.grouped_swizzle_for_gemm(grouped, True, False)
    return grouped


def _columnwise_unswizzled(te):
    x = torch.randn(256, HIDDEN).to(torch.bfloat16)
    return te.tex.group_quantize(x, quantizer(te, columnwise=True), 2)


REJECTED = [  # (the grouped input, the op's quantizer, return_dequantized, TE's message)
    (_gemm_ready, lambda te: quantizer(te, columnwise=True, gemm_ready=True), True, "requires scales in compact"),
    (_swizzled_rowwise_only, lambda te: quantizer(te, columnwise=True), False, "cannot be rebuilt"),
    (lambda te: wire(te)[0], lambda te: quantizer(te, dtype=te.tex.DType.kFloat8E5M2), False, "FP8 dtype"),
    (lambda te: wire(te)[0], lambda te: te.Block(te.tex.DType.kFloat8E4M3, rowwise=True, columnwise=False),
     False, "disagree on quantization format"),
    (_columnwise_unswizzled, lambda te: quantizer(te, columnwise=True), False, "already has columnwise data"),
    (lambda te: wire(te, splits=[64, 32])[0], lambda te: quantizer(te), False, "multiples of 128"),
]


@pytest.mark.parametrize("make, make_quantizer, dequantized, message", REJECTED)
def test_rejected_inputs_raise_tes_error(te, make, make_quantizer, dequantized, message) -> None:
    grouped = make(te)
    with pytest.raises(RuntimeError, match=message):
        te.tex.group_requantize_inplace(grouped, make_quantizer(te), grouped.num_tensors, None,
                                        te.tex.DType.kBFloat16, return_dequantized=dequantized)


def test_a_gemm_ready_input_passes_through(te) -> None:
    grouped = _gemm_ready(te)
    buffers = (grouped.rowwise_data, grouped.columnwise_data, grouped.scale_inv)
    assert te.tex.group_requantize_inplace(grouped, quantizer(te, columnwise=True, gemm_ready=True), 2, None,
                                           te.tex.DType.kBFloat16) is None
    assert (grouped.rowwise_data, grouped.columnwise_data, grouped.scale_inv) == buffers


def _unswizzled(original):
    def swizzle(compact):  # padded to the tiles, the compact order kept
        rows, cols = (block_scales.round_up(n, tile) for n, tile in zip(compact.shape, (128, 4)))
        return block_scales.padded(compact, rows, cols).reshape(-1)
    return swizzle


def _reshaped_not_transposed(original):
    def swizzle(compact):  # a columnwise region read as (cols, rows) by a reshape: the sizes fit, the order does not
        return original(compact.contiguous().reshape(compact.shape) if compact.is_contiguous()
                        else compact.t().reshape(compact.shape))
    return swizzle


def _doubled(original):
    def group_dequantize(input, otype):
        out = original(input, otype)
        out.rowwise_data.mul_(2)
        return out
    return group_dequantize


def _padding_kept(original):
    return lambda kind, shape, columnwise: (1 << 30, 1 << 30)  # the whole padded region swizzled, padding and all


# (the module and name replaced, how, a check that catches it)
FAULTS = [("scales", "swizzle", _unswizzled, check_swizzle_layout),
          ("bq", "compact_scale_dims", _padding_kept, check_swizzle_layout),
          ("scales", "swizzle", _reshaped_not_transposed, check_swizzle_columnwise),
          ("gq", "group_dequantize", _doubled, check_requantize)]


@pytest.mark.parametrize("owner, name, fault, check", FAULTS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_planted_fault_is_caught(te, monkeypatch, owner, name, fault, check) -> None:
    module = getattr(te, owner)
    monkeypatch.setattr(module, name, fault(getattr(module, name)))
    with pytest.raises(AssertionError):
        check(te)
