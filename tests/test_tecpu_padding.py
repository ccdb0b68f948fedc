"""tex.fused_multi_row_padding / fused_multi_row_unpadding against their definition (csrc/extensions/padding.cpp,
common/util/padding.cu): the input read as consecutive splits; padding writes each split's rows then zeros up to its
padded count; unpadding the first unpadded rows of each padded split; a split with no input rows is skipped (its
output rows keep what was there). The reference is built from slices and torch.cat, not from the emulation's loop.
TE's Fp8Padding / Fp8Unpadding run over it (what TE's test_custom_recipe.py's bad-splits items reach)."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu

SENTINEL = 7.0  # what a skipped split's output rows keep


@pytest.fixture(scope="module")
def tex() -> types.ModuleType:
    tecpu.boot()
    import transformer_engine_torch

    return transformer_engine_torch


def _reference_padding(x: torch.Tensor, rows: list[int], padded: list[int]) -> torch.Tensor:
    parts = []
    for split, n, p in zip(torch.split(x, rows), rows, padded):
        kept = split if n else torch.full((p, x.shape[1]), SENTINEL, dtype=x.dtype)
        parts.append(torch.cat([kept, torch.zeros(p - kept.shape[0], x.shape[1], dtype=x.dtype)]))
    return torch.cat(parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_then_unpadding_against_slices(tex, dtype) -> None:
    rows, padded = [3, 0, 5, 1], [4, 4, 8, 16]
    x = torch.randn(sum(rows), 6).to(dtype)
    out = torch.full((sum(padded), 6), SENTINEL, dtype=dtype)
    tex.fused_multi_row_padding(x, out, rows, padded)
    want = _reference_padding(x, rows, padded)
    bad = (out != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"padded rows {bad} differ from the split-wise reference"
    back = torch.full_like(x, SENTINEL)
    tex.fused_multi_row_unpadding(out, back, padded, rows)
    assert torch.equal(back, x), "unpadding(padding(x)) is not x"


def test_shrinking_split_is_refused(tex) -> None:
    x, out = torch.randn(5, 4), torch.empty(4, 4)
    with pytest.raises(tecpu.Unemulated, match=r"fused_multi_row_padding with \(rows, padded rows\) \[\(5, 4\)\]"):
        tex.fused_multi_row_padding(x, out, [5], [4])


def test_te_fp8_padding_modules_forward_and_backward(tex) -> None:
    from transformer_engine.pytorch import Fp8Padding, Fp8Unpadding

    x = torch.randn(32, 16, requires_grad=True)
    padding, unpadding = Fp8Padding(2, align_size=16), Fp8Unpadding(2, align_size=16)
    padded, padded_splits = padding(x, [17, 15])
    assert padded_splits == [32, 16], f"TE's padded splits {padded_splits}"
    assert torch.equal(padded, _reference_padding(x.detach(), [17, 15], [32, 16])), "Fp8Padding's output"
    weights = torch.randn(48, 16)
    (unpadding(padded * weights, [17, 15]) ** 2).sum().backward()
    rows = torch.cat([torch.arange(17), torch.arange(32, 47)])
    want = 2 * x.detach() * weights[rows] ** 2
    assert torch.allclose(x.grad, want, rtol=1e-6, atol=0), "gradient through Fp8Unpadding and Fp8Padding"
