"""tex's context-parallel THD helpers (te/tecpu/thd_context_parallel.py, thd_partition.py, thd_layout.py)
against common/fused_attn/context_parallel.cu's definitions, written here per sequence with slices and scalar
loops, not from the emulation's vectorised indexing:
- halves: sequence [start, start + n) has halves [start, start + n/2) and [start + n/2, start + n); read_half_tensor
  concatenates one half of every sequence, read_second_half_lse the second halves of the LSE ([h, t] packed, or per
  sequence [b, h, s] at columns n/2 .. n, zeros past them);
- partitions: rank r of cp takes chunks r and 2 cp - 1 - r of every sequence cut in 2 cp chunks; the reorders are
  that permutation and its inverse; copy_valid copies rows padded[s] .. padded[s] + valid length of each sequence;
- corrections, scalar by scalar in numpy float32 as the fast-math kernel computes them: subnormals flushed, expf as
  2^(fp32(x * fp32(log2 e))) (libm's 2^t rounded once), log1pf correctly rounded; bitwise. The LSE correction is also
  checked against fp64 logaddexp within a derived bound (below), the output correction against fp64 out + p e^(l - L).
  The LSE's final rounding hides expf's ulps (log1p(e) moves by far less than the result's ulp), so its planted
  fault is the textbook fp32 formula; the pre-2.20 out_correction runs under a patched TE version (2.20's refused).
Planted faults (the binary search taking a boundary token into the sequence before, the second-half rank of a
partition mirrored, the LSE merge as the textbook fp32 formula, expf without the fp32 product, the corrected output
rounded once instead of twice, a gradient mode on the wrong half) each fail a check their clean twin passes."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from packaging.version import Version

from te_verify.te import tecpu
from te_verify.te.tecpu import thd_context_parallel as thd
from te_verify.te.tecpu import thd_layout as layout
from te_verify.te.tecpu import thd_partition

F = np.float32
CU = [0, 8, 8, 20, 32]  # an empty sequence; every length a multiple of 4 (halves of halves stay whole)
CU_CP = [0, 8, 8, 24, 32]  # multiples of 8: cp up to 4
LOG2E = F(1.4426950216293335)


@pytest.fixture(scope="module")
def tex() -> types.ModuleType:
    tecpu.boot()
    import transformer_engine_torch

    return transformer_engine_torch


def cu32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def sequences(cu: list[int]) -> list[tuple[int, int]]:
    return [(cu[i], cu[i + 1] - cu[i]) for i in range(len(cu) - 1)]


def randn(*shape: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


# Scalar models of the kernels' fp32 arithmetic (fast math: FTZ, __expf).
def ftz(x: np.float32) -> np.float32:
    return F(0) * x if abs(x) < 2.0 ** -126 else x


def fast_exp(x: np.float32) -> np.float32:
    return ftz(F(2.0 ** float(ftz(F(x) * LOG2E))))


def lse_merge(a: float, b: float) -> np.float32:
    a, b = ftz(F(a)), ftz(F(b))
    high, low = np.fmax(a, b), np.fmin(a, b)
    return ftz(high + ftz(F(math.log1p(float(fast_exp(ftz(low - high)))))))


def dtype_round(x: float, dtype: torch.dtype) -> float:
    return float(F(x)) if dtype == torch.float32 else float(torch.tensor(float(F(x))).to(dtype))


def corrected(o: float, p: float, e: np.float32, dtype: torch.dtype) -> float:
    if dtype == torch.float32:
        add = F(0) if ftz(F(p)) == 0 else ftz(ftz(F(p)) * e)
        return float(ftz(ftz(F(o)) + add))
    add = 0.0 if p == 0 else dtype_round(float(ftz(ftz(F(p)) * e)), dtype)
    return dtype_round(o + add, dtype)


def check_read_half(tex) -> None:
    t = CU[-1] + 4  # rows past the last sequence: never read
    for dtype, shape, seq_dim in ((torch.float32, (t, 2, 4), 0), (torch.bfloat16, (2, t, 2, 4), 1)):
        x = randn(*shape, dtype=dtype, seed=1)
        for half_idx in (0, 1):
            got = tex.thd_read_half_tensor(x, cu32(CU), half_idx)
            want = torch.cat([x.narrow(seq_dim, s + half_idx * (n // 2), n // 2) for s, n in sequences(CU)], seq_dim)
            assert got.shape[seq_dim] == t // 2, f"half's shape {tuple(got.shape)}"
            assert torch.equal(got.narrow(seq_dim, 0, CU[-1] // 2), want), f"half {half_idx} of {dtype} {shape}"


def check_read_second_half_lse(tex) -> None:
    heads, s_max = 3, 12
    packed = randn(heads, CU[-1], seed=2)
    got = tex.thd_read_second_half_lse(packed, cu32(CU), True, CU[-1] // 2 + 2)
    want = torch.cat([packed[:, s + n // 2:s + n] for s, n in sequences(CU)] + [torch.zeros(heads, 2)], 1)
    assert torch.equal(got, want), "packed second halves"
    cu = [0, 12, 16, 16, 24]  # batch-major [b, h, s_max]: lengths up to s_max
    lse = randn(4, heads, s_max, seed=3)
    got = tex.thd_read_second_half_lse(lse, cu32(cu), False, s_max // 2)
    want = torch.zeros(4, heads, s_max // 2)
    for i, (_, n) in enumerate(sequences(cu)):
        want[i, :, :n // 2] = lse[i, :, n // 2:n]
    assert torch.equal(got, want), "batch-major second halves"


def check_copy_valid(tex) -> None:
    padded, valid = [2, 6, 12, 12, 16], [0, 3, 9, 9, 11]  # a leading offset, lengths 3, 6, 0, 2 within 4, 6, 0, 4
    inp = randn(18, 2, 4, dtype=torch.float16, seed=4)
    out = torch.full_like(inp, -1)
    tex.thd_copy_valid_tokens_from_per_split_to_rank_local(out, inp, cu32(padded), cu32(valid))
    want = torch.full_like(inp, -1)
    for (start, _), (_, n) in zip(sequences(padded), sequences(valid)):
        want[start:start + n] = inp[start:start + n]
    assert torch.equal(out, want), "copied rows"


def partition(cu: list[int], cp: int, rank: int) -> list[int]:
    rows = []
    for start, n in sequences(cu):
        chunk = n // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            rows += range(start + c * chunk, start + (c + 1) * chunk)
    return rows


def check_partitions(tex) -> None:
    x = randn(CU_CP[-1], 2, 4, dtype=torch.bfloat16, seed=5)
    for cp in (1, 2, 4):
        order = []
        for rank in range(cp):
            got = tex.thd_get_partitioned_indices(cu32(CU_CP), CU_CP[-1], cp, rank)
            assert got.dtype == torch.int32 and got.tolist() == partition(CU_CP, cp, rank), f"cp {cp} rank {rank}"
            order += partition(CU_CP, cp, rank)
        ranked = tex.thd_sequence_order_to_cp_rank_order(x, cu32(CU_CP), cp, CU_CP[-1])
        assert torch.equal(ranked, x[order]), f"sequence -> rank order, cp {cp}"
        back = tex.thd_cp_rank_order_to_sequence_order(ranked, cu32(CU_CP), cp, CU_CP[-1])
        assert torch.equal(back, x), f"rank -> sequence order, cp {cp}"


def lse_case(packed: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[tuple[int, ...], tuple]]]:
    """(lse, lse_per_step, [(place in lse, place in lse_per_step)]), |d| up to ~30."""
    heads, cu = 2, CU if packed else [0, 8, 12, 12, 16]
    places = []
    for i, (start, n) in enumerate(sequences(cu)):
        for c in range(n // 2):
            for h in range(heads):
                places.append(((h, start + n // 2 + c), (h, start // 2 + c)) if packed else
                              ((i, h, n // 2 + c), (i, h, c)))
    shape = (heads, cu[-1]) if packed else (len(cu) - 1, heads, 8)
    lse = randn(*shape, seed=seed)  # small: the result's ulp is fine enough to see log1p's and expf's roundings
    step = randn(*shape[:-1], shape[-1] // 2, seed=seed + 1, scale=8.0)
    step.view(-1)[::7] = -math.inf  # a step that saw only masked keys
    return lse, step, places


def check_lse_correction_bitwise(tex) -> None:
    for packed in (True, False):
        lse, step, places = lse_case(packed, 6)
        got = lse.clone()
        tex.thd_second_half_lse_correction(got, step, cu32(CU if packed else [0, 8, 12, 12, 16]), packed)
        want = lse.clone()
        for at, at_step in places:
            want[at] = float(lse_merge(float(lse[at]), float(step[at_step])))
        bad = (got != want).nonzero().tolist()
        assert not bad, f"LSE entries {bad[:4]} differ from the fast-math scalar model (packed {packed})"


def check_lse_correction_fp64(tex) -> None:
    """|emulated - logaddexp| <= 2^-22 + 2^-24 |R|: d = low - high and t = d log2e are rounded to fp32 (relative
    2^-24 each, e's relative error |d| 2^-23 + 2^-24 with 2^t's rounding); log1p's slope e / (1 + e) times that is at
    most (2 / e + 1) 2^-24 as |d| e^-|d| <= 1 / e; log1p's rounding is within 2^-25 (it is below ln 2), the final
    add's within 2^-24 |R|: in all under 2.3 2^-24 + 2^-24 |R|."""
    for packed in (True, False):
        lse, step, places = lse_case(packed, 8)
        got = lse.clone()
        tex.thd_second_half_lse_correction(got, step, cu32(CU if packed else [0, 8, 12, 12, 16]), packed)
        for at, at_step in places:
            ref = float(np.logaddexp(float(lse[at]), float(step[at_step])))
            assert abs(float(got[at]) - ref) <= 2.0 ** -22 + 2.0 ** -24 * abs(ref), f"LSE at {at}: {got[at]} vs {ref}"
        touched = torch.zeros_like(lse, dtype=torch.bool)
        for at, _ in places:
            touched[at] = True
        assert torch.equal(got[~touched], lse[~touched]), "entries outside the second halves changed"


def out_case(dtype: torch.dtype, only_second_half: bool, packed: bool, seed: int, specials: bool):
    heads, dim = 2, 8
    cu = CU if packed else [0, 8, 12, 12, 16]
    total = cu[-1]
    halves = 2 if only_second_half else 1
    out = randn(total, heads, dim, dtype=dtype, seed=seed)
    step = randn(total // halves, heads, dim, dtype=dtype, seed=seed + 1)
    lse_shape = (heads, total) if packed else (len(cu) - 1, heads, 8)
    lse = randn(*lse_shape, seed=seed + 2, scale=3.0)
    lse_step = randn(*lse_shape[:-1], lse_shape[-1] // halves, seed=seed + 3, scale=3.0)
    if specials:
        step.view(-1)[::5] = 0.0  # the kernel adds 0 for them, even where exp is inf
        lse.view(-1)[::11] = -math.inf
    return cu, out, step, lse, lse_step


def reference_out(cu, out, step, lse, lse_step, only_second_half, packed) -> torch.Tensor:
    want = out.clone()
    halves = 2 if only_second_half else 1
    for i, (start, n) in enumerate(sequences(cu)):
        m = n // halves  # the sequence's per-step rows: its second half, or all of it
        for c in range(m):
            row, step_row = start + (n - m) + c, start // halves + c
            for h in range(out.shape[1]):
                big = float(lse[h, row] if packed else lse[i, h, (n - m) + c])
                small = float(lse_step[h, step_row] if packed else lse_step[i, h, c])
                e = fast_exp(ftz(ftz(F(small)) - ftz(F(big))))
                for d in range(out.shape[2]):
                    want[row, h, d] = corrected(float(out[row, h, d]), float(step[step_row, h, d]), e, out.dtype)
    return want


CORRECTIONS = [(dtype, second, packed) for dtype in (torch.float32, torch.bfloat16) for second in (False, True)
               for packed in (True, False)]


def check_out_correction(tex, monkeypatch) -> None:
    monkeypatch.setattr(thd, "installed_te_version", lambda: Version("2.19.0"))  # the form without old_lse
    for dtype, second, packed in CORRECTIONS:
        cu, out, step, lse, lse_step = out_case(dtype, second, packed, 10, specials=True)
        got = out.clone()
        tex.thd_out_correction(got, step, lse, lse_step, cu32(cu), second, packed)
        want = reference_out(cu, out, step, lse, lse_step, second, packed)
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all()), f"out rows {same.all(-1).all(-1).logical_not().nonzero().flatten().tolist()} " \
                                 f"differ from the scalar model ({dtype}, only_second_half {second}, packed {packed})"


def check_out_correction_fp64(tex, monkeypatch) -> None:
    """|emulated - (o + p e^(l - L))| <= |p E| ((2 |d| + 2) 2^-24 + u) + u |R| (u: the dtype's unit roundoff; the
    product and the sum rounded to it, E's relative error from d, t and 2^t's fp32 roundings as for the LSE)."""
    monkeypatch.setattr(thd, "installed_te_version", lambda: Version("2.19.0"))
    for dtype, second, packed in CORRECTIONS:
        cu, out, step, lse, lse_step = out_case(dtype, second, packed, 20, specials=False)
        got = out.clone()
        tex.thd_out_correction(got, step, lse, lse_step, cu32(cu), second, packed)
        u, halves = (2.0 ** -24 if dtype == torch.float32 else 2.0 ** -8), (2 if second else 1)
        for i, (start, n) in enumerate(sequences(cu)):
            m = n // halves
            for c in range(m):
                row, step_row = start + (n - m) + c, start // halves + c
                for h in range(out.shape[1]):
                    d = float(lse_step[h, step_row] if packed else lse_step[i, h, c]) - float(
                        lse[h, row] if packed else lse[i, h, (n - m) + c])
                    p = step[step_row, h].double()
                    ref = out[row, h].double() + p * math.exp(d)
                    tol = (p * math.exp(d)).abs() * ((2 * abs(d) + 2) * 2.0 ** -24 + u) + u * ref.abs()
                    assert bool(((got[row, h].double() - ref).abs() <= tol).all()), f"out row {row} head {h}"


def reference_grad(grad, step, cu, modes, seq_dim) -> torch.Tensor:
    want = grad.clone()
    full = modes in (("add", "copy"), ("copy", "add"))
    for start, n in sequences(cu):
        for half, mode in enumerate(modes):
            if mode == "none":
                continue
            rows = want.narrow(seq_dim, start + half * (n // 2), n // 2)
            src = step.narrow(seq_dim, start + half * (n // 2) if full else start // 2, n // 2)
            if mode == "copy":
                rows.copy_(src)
            elif grad.dtype == torch.float32:  # add.ftz.f32
                flush = (lambda x: torch.where(x.abs() < 2.0 ** -126, x * 0, x))
                rows.copy_(flush(flush(rows) + flush(src)))
            else:
                rows.copy_(rows + src)
    return want


def check_grad_correction(tex) -> None:
    for dtype, shape, seq_dim in ((torch.float32, (CU[-1], 2, 4), 0), (torch.float16, (2, CU[-1], 2, 4), 1)):
        grad = randn(*shape, dtype=dtype, seed=30)
        if dtype == torch.float32:
            grad.view(-1)[::9] = 3e-39  # subnormal: flushed by the add, kept by a copy
        for modes in thd.GRAD_MODES:
            full = modes in (("add", "copy"), ("copy", "add"))
            step_shape = list(shape)
            step_shape[seq_dim] //= 1 if full else 2
            step = randn(*step_shape, dtype=dtype, seed=31)
            got = grad.clone()
            tex.thd_grad_correction(got, step, cu32(CU), *modes)
            want = reference_grad(grad, step, CU, modes, seq_dim)
            assert torch.equal(got.view(torch.int16 if dtype == torch.float16 else torch.int32),
                               want.view(torch.int16 if dtype == torch.float16 else torch.int32)), f"{modes} {dtype}"


def test_read_half_tensor(tex) -> None:
    check_read_half(tex)


def test_read_second_half_lse(tex) -> None:
    check_read_second_half_lse(tex)


def test_copy_valid_tokens(tex) -> None:
    check_copy_valid(tex)


def test_partitioned_indices_and_reorders(tex) -> None:
    check_partitions(tex)


def test_second_half_lse_correction_bitwise_and_against_fp64(tex) -> None:
    check_lse_correction_bitwise(tex)
    check_lse_correction_fp64(tex)


def test_out_correction_bitwise_and_against_fp64(tex, monkeypatch) -> None:
    check_out_correction(tex, monkeypatch)
    check_out_correction_fp64(tex, monkeypatch)


def test_grad_correction(tex) -> None:
    check_grad_correction(tex)


def mirrored_partition(tokens, rank, bounds, world, what):
    """The second-half chunk of rank r taken as cp - 1 - r (not 2 cp - 1 - r) chunks of L / 2 on."""
    seq = layout.search(bounds, what, tokens)[1]
    start = bounds[seq]
    index, half = tokens - start, (bounds[seq + 1] - start) // 2
    return index + start * world + half * torch.where(index < half, rank, world - 1 - rank)


def _plant(monkeypatch, fault: str) -> None:
    if fault == "boundary token in the sequence before":
        clean = layout.search
        monkeypatch.setattr(layout, "search", lambda bounds, what, tokens=None: (lambda t: (t, torch.searchsorted(
            bounds[1:-1].contiguous(), t, right=False)))(clean(bounds, what, tokens)[0]))
    elif fault == "second-half rank mirrored":
        monkeypatch.setattr(thd_partition, "_partition_source", mirrored_partition)
    elif fault == "the textbook fp32 LSE merge":
        monkeypatch.setattr(thd, "_merge", lambda a, b: torch.fmax(a, b) + torch.log(
            1 + torch.exp(torch.fmin(a, b) - torch.fmax(a, b))))
    elif fault == "expf without the fp32 product":
        monkeypatch.setattr(thd, "_fast_exp", torch.exp)
    elif fault == "corrected output rounded once":
        monkeypatch.setattr(thd, "_corrected", lambda out, step, scale: torch.where(
            step == 0, out.float(), out.float() + step.float() * scale).to(out.dtype))
    elif fault == "mode on the wrong half":
        monkeypatch.setitem(thd.GRAD_MODES, ("none", "add"), 0)


FAULTS = [("boundary token in the sequence before", check_read_half),
          ("boundary token in the sequence before", check_copy_valid),
          ("second-half rank mirrored", check_partitions),
          ("the textbook fp32 LSE merge", check_lse_correction_bitwise),
          ("expf without the fp32 product", check_out_correction),
          ("corrected output rounded once", check_out_correction),
          ("mode on the wrong half", check_grad_correction)]


@pytest.mark.parametrize("fault, check", FAULTS, ids=[f"{f}-{c.__name__}" for f, c in FAULTS])
def test_planted_fault_is_caught(tex, monkeypatch, fault, check) -> None:
    args = (tex, monkeypatch) if check is check_out_correction else (tex,)
    _plant(monkeypatch, fault)
    with pytest.raises(AssertionError):
        check(*args)


def test_te_2_20s_incremental_forms_are_refused_and_older_modes_raise(tex, monkeypatch) -> None:
    cu, out, step, lse, lse_step = out_case(torch.float32, False, True, 40, specials=False)
    with pytest.raises(tecpu.Unemulated, match="thd_out_correction of TE 2.20.2 .*old_lse"):
        tex.thd_out_correction(out, step, lse.clone(), lse, lse_step, cu32(cu), False, True)
    grad, half = torch.zeros(CU[-1], 2, 4), torch.ones(CU[-1] // 2, 2, 4)
    with pytest.raises(tecpu.Unemulated, match="'zero' mode"):
        tex.thd_grad_correction(grad, half, cu32(CU), "zero", "copy")
    monkeypatch.setattr(thd, "installed_te_version", lambda: Version("2.19.0"))
    with pytest.raises(RuntimeError, match="Unsupported Functor of first half and second_half"):
        tex.thd_grad_correction(grad, half, cu32(CU), "zero", "copy")


@pytest.mark.parametrize("call, error, message", [
    (lambda tex: tex.thd_read_half_tensor(torch.zeros(8, 1, 4, dtype=torch.float16), cu32([0, 8]), 0),
     RuntimeError, "hidden_size_in_bytes % 16 == 0"),
    (lambda tex: tex.thd_read_half_tensor(torch.zeros(8, 2, 4), torch.tensor([0, 8]), 0),
     RuntimeError, r"cu_seqlens.scalar_type\(\) == at::ScalarType::Int"),
    (lambda tex: tex.thd_read_half_tensor(torch.zeros(8, 2, 4), cu32([0, 8]), 2), tecpu.Unemulated, "half_idx 2"),
    (lambda tex: tex.thd_read_half_tensor(torch.zeros(8, 2, 4), cu32([0, 12]), 1), tecpu.Unemulated,
     "past its memory"),
    (lambda tex: tex.thd_get_partitioned_indices(cu32([0, 6, 12]), 12, 2, 0), RuntimeError, "device-side assert"),
    (lambda tex: tex.thd_get_partitioned_indices(cu32([0, 8]), 8, 2, 2), RuntimeError, "rank < world_size"),
    (lambda tex: tex.thd_cp_rank_order_to_sequence_order(torch.zeros(8, 4), cu32([0, 8]), 2, 6),
     RuntimeError, "total_tokens % "),
    (lambda tex: tex.thd_copy_valid_tokens_from_per_split_to_rank_local(
        torch.zeros(4, 8)[:, ::2], torch.zeros(4, 4), cu32([0, 4]), cu32([0, 4])), RuntimeError,
     "output must be contiguous"),
])
def test_checks_and_refusals(tex, call, error, message) -> None:
    with pytest.raises(error, match=message):
        call(tex)
