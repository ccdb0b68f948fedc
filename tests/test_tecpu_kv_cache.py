"""tex.copy_to_kv_cache, convert_thd_to_bshd and convert_bshd_to_thd against common/fused_attn/kv_cache.cu's
definitions, written here token by token on the tensors' logical indices (not the emulation's flat row runs):
- thd -> bshd: out[i, j] = x[cu[i] + j] for j < cu[i+1] - cu[i], zeros elsewhere; bshd -> thd the other way;
- copy_to_kv_cache: non-paged, first the reindexing (up to the last descent of batch_indices, sequence i's earlier
  tokens copied from cache block batch_indices[i] to block i, in sequence order; every sequence when
  batch_indices[0] != 0, else those out of place), then new token j of sequence i to position cached - new + j of
  its page (page i, non-paged; page_table[i, p / page_size] paged), read from [i, j] (bshd), [j, i] (sbhd) or
  cu_new[i] + j (thd).
Data are random bit patterns (NaN payloads included), compared as integers: a copy is bitwise or wrong. Planted
faults (the reindexing in reverse order, a run one token short, a token's last element not copied) each fail a
check that their clean twin passes. TE's THD conversion custom ops (attention's THD path) run forward and backward."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import kv_cache

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
        torch.float8_e4m3fn: torch.uint8}


@pytest.fixture(scope="module")
def tex() -> types.ModuleType:
    tecpu.boot()
    import transformer_engine_torch

    return transformer_engine_torch


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ints = BITS[dtype]
    lo, hi = (0, 256) if ints == torch.uint8 else (torch.iinfo(ints).min, torch.iinfo(ints).max)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(ints).view(dtype)


def assert_bitwise(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    bad = (got.view(BITS[got.dtype]) != want.view(BITS[want.dtype])).nonzero().tolist()
    assert not bad, f"{what}: {len(bad)} elements differ, first at {bad[0]}"


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


CU = [0, 3, 3, 7, 8]  # 4 sequences of 3, 0, 4, 1 tokens


def check_conversions(tex, dtype: torch.dtype) -> None:
    x = random_bits((8, 2, 5), dtype, 1)
    bshd = tex.convert_thd_to_bshd(x, i32(CU), 4, 6)
    want = torch.zeros(4, 6, 2, 5, dtype=dtype)
    for i in range(4):
        for j in range(CU[i + 1] - CU[i]):
            want[i, j] = x[CU[i] + j]
    assert_bitwise(bshd, want, "convert_thd_to_bshd")
    padded = random_bits((4, 6, 2, 5), dtype, 2)  # tokens past each length must not reach the output
    thd = tex.convert_bshd_to_thd(padded, i32(CU), 9)
    want = torch.zeros(9, 2, 5, dtype=dtype)
    for i in range(4):
        for j in range(CU[i + 1] - CU[i]):
            want[CU[i] + j] = padded[i, j]
    assert_bitwise(thd, want, "convert_bshd_to_thd")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_conversions_token_by_token(tex, dtype) -> None:
    check_conversions(tex, dtype)


def test_strides_are_ignored_as_the_kernel_ignores_them(tex) -> None:
    """The kernels take the data pointer and the shape: a transposed view is read as its memory in order."""
    base = random_bits((8, 5, 2), torch.bfloat16, 8)
    got = tex.convert_thd_to_bshd(base.transpose(1, 2), i32(CU), 4, 6)
    assert_bitwise(got, tex.convert_thd_to_bshd(base.reshape(8, 2, 5), i32(CU), 4, 6), "transposed thd input")


def reference_copy(new_k, new_v, k_cache, v_cache, page_table, cu_new, cu_cached, fmt, b, max_ctx_len, max_seq_len,
                   max_pages, non_paged):
    """The caches after the kernels, on clones, token by token; caches indexed [page, position in page]."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    page_size = max_seq_len // max_pages
    new = [cu_new[i + 1] - cu_new[i] for i in range(b)]
    cached = [cu_cached[i + 1] - cu_cached[i] for i in range(b)]
    if non_paged:
        order = page_table.flatten().tolist()[:b]
        last = max([i + 1 for i in range(b - 1) if order[i + 1] < order[i]], default=b)
        for i in range(last):
            if order[0] != 0 or order[i] - order[0] != i:
                for t in range(cached[i] - new[i]):
                    k_cache[i, t] = k_cache[order[i], t]
                    v_cache[i, t] = v_cache[order[i], t]
    for i in range(b):
        for j in range(new[i]):
            p = cached[i] - new[i] + j
            page = i if non_paged else page_table[i, p // page_size].item()
            source = {"bshd": (i, j), "sbhd": (j, i), "thd": (cu_new[i] + j,)}[fmt]
            k_cache[page, p % page_size] = new_k[source]
            v_cache[page, p % page_size] = new_v[source]
    return k_cache, v_cache


def kv_case(fmt: str, order: list[int], paged: bool, dtype=torch.bfloat16) -> dict:
    """A step of 3 sequences (1, 1 and 3 new tokens; 4, 2 and 2 cached before) in a 4-sequence cache of 8 tokens,
    h 2, d_k 4, d_v 3; paged: 2-token pages, each sequence its own shuffled pages."""
    b, max_ctx_len, max_seq_len, h = (3, 4, 8, 2) if fmt != "thd" else (4, 1, 8, 2)
    cu_new, cu_cached = [0, 1, 2, 5, 5][:b + 1], [0, 5, 8, 13, 13][:b + 1]
    shape = {"bshd": (b, max_ctx_len), "sbhd": (max_ctx_len, b), "thd": (5,)}[fmt]
    max_pages, page_size = (4, 2) if paged else (1, 8)
    blocks = 16 if paged else 4
    if paged:
        table = torch.randperm(16, generator=torch.Generator().manual_seed(3))[:16].reshape(4, 4).to(torch.int32)
    else:
        table = i32(order).reshape(4, 1)
    return dict(new_k=random_bits((*shape, h, 4), dtype, 4), new_v=random_bits((*shape, h, 3), dtype, 5),
                k_cache=random_bits((blocks, page_size, h, 4), dtype, 6),
                v_cache=random_bits((blocks, page_size, h, 3), dtype, 7), page_table=table, cu_new=cu_new,
                cu_cached=cu_cached, fmt=fmt, b=b, max_ctx_len=max_ctx_len, max_seq_len=max_seq_len,
                max_pages=max_pages, non_paged=not paged)


def check_copy(tex, case: dict) -> None:
    want_k, want_v = reference_copy(**case)
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    fmt = getattr(tex.NVTE_QKV_Format, "NVTE_" + case["fmt"].upper())
    tex.copy_to_kv_cache(case["new_k"], case["new_v"], k_cache, v_cache, case["page_table"], i32(case["cu_new"]),
                         i32(case["cu_cached"]), fmt, case["b"], case["max_ctx_len"], case["max_seq_len"],
                         case["max_pages"], case["non_paged"])
    assert_bitwise(k_cache, want_k, f"{case['fmt']} k_cache")
    assert_bitwise(v_cache, want_v, f"{case['fmt']} v_cache")


ORDERS = {"reordered": [0, 2, 3, 1], "first moved": [1, 0, 2, 3], "in place": [0, 1, 2, 3]}


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_non_paged_copy_with_reindexing(tex, fmt, order) -> None:
    check_copy(tex, kv_case(fmt, ORDERS[order], paged=False))


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_paged_copy(tex, fmt) -> None:
    check_copy(tex, kv_case(fmt, [], paged=True, dtype=torch.float8_e4m3fn))


def _plant(monkeypatch, fault: str) -> None:
    if fault == "reindexing in reverse order":
        clean = kv_cache._reindex_moves
        monkeypatch.setattr(kv_cache, "_reindex_moves", lambda *a: clean(*a)[::-1])
    elif fault == "a run one token short":
        clean_runs = kv_cache._token_runs
        monkeypatch.setattr(kv_cache, "_token_runs", lambda s, t: [(a, b, n - (n > 1)) for a, b, n in clean_runs(s, t)])
    elif fault == "a token's last element not copied":
        clean_write = kv_cache.write
        monkeypatch.setattr(kv_cache, "write", lambda dst, value: clean_write(dst[:-1], value[:-1]))


@pytest.mark.parametrize("fault", [None, "reindexing in reverse order", "a run one token short",
                                   "a token's last element not copied"])
def test_planted_fault_is_caught(tex, monkeypatch, fault) -> None:
    """Each planted fault fails the copy check of the reordered bshd step; the clean twin (None) passes it; the last
    one fails the conversions too."""
    _plant(monkeypatch, fault)
    case = kv_case("bshd", ORDERS["reordered"], paged=False)
    if fault is None:
        check_copy(tex, case)
        check_conversions(tex, torch.bfloat16)
        return
    with pytest.raises(AssertionError, match="k_cache"):
        check_copy(tex, case)
    if fault == "a token's last element not copied":
        with pytest.raises(AssertionError, match="convert_thd_to_bshd"):
            check_conversions(tex, torch.bfloat16)


def test_checks_and_refusals(tex) -> None:
    x = torch.zeros(8, 2, 5)
    with pytest.raises(tecpu.Unemulated, match="int64 index tensors"):
        tex.convert_thd_to_bshd(x, torch.tensor(CU), 4, 6)
    with pytest.raises(tecpu.Unemulated, match="longer than max_seq_len 3"):
        tex.convert_thd_to_bshd(x, i32(CU), 4, 3)
    with pytest.raises(tecpu.Unemulated, match="twice"):  # sequences overlapping in the packed output
        tex.convert_bshd_to_thd(torch.zeros(3, 4, 2, 5), i32([0, 3, 1, 3]), 4)
    case = kv_case("bshd", ORDERS["reordered"], paged=True)
    case["page_table"][2, 2] = case["page_table"][0, 2]  # position 4 of sequences 0 and 2: a race
    with pytest.raises(tecpu.Unemulated, match="twice"):
        check_copy(tex, case)
    case = kv_case("bshd", ORDERS["reordered"], paged=False)
    with pytest.raises(tecpu.Unemulated, match="sharing memory"):  # one allocation for both caches
        tex.copy_to_kv_cache(case["new_k"], case["new_v"], case["k_cache"], case["k_cache"][:, :, :, :3],
                             case["page_table"], i32(case["cu_new"]), i32(case["cu_cached"]),
                             tex.NVTE_QKV_Format.NVTE_BSHD, 3, 4, 8, 1, True)
    with pytest.raises(RuntimeError, match="must be of the same data type"):
        tex.copy_to_kv_cache(case["new_k"].float(), case["new_v"], case["k_cache"], case["v_cache"],
                             case["page_table"], i32(case["cu_new"]), i32(case["cu_cached"]),
                             tex.NVTE_QKV_Format.NVTE_BSHD, 3, 4, 8, 1, True)
    with pytest.raises(RuntimeError, match="qkv_format must be"):
        tex.copy_to_kv_cache(case["new_k"], case["new_v"], case["k_cache"], case["v_cache"], case["page_table"],
                             i32(case["cu_new"]), i32(case["cu_cached"]), tex.NVTE_QKV_Format.NVTE_BHSD, 3, 4, 8, 1,
                             True)


def test_te_thd_conversion_ops_forward_and_backward(tex) -> None:
    """TE's te_attention custom ops (attention's THD path): thd -> bshd and its gradient, bshd -> thd."""
    from transformer_engine.pytorch.attention.dot_product_attention.utils import ConvertTHDtoBSHD

    x = torch.randn(8, 2, 5, requires_grad=True)
    bshd = ConvertTHDtoBSHD.apply(x, i32(CU), 6)
    grad = torch.randn(4, 6, 2, 5)
    (bshd * grad).sum().backward()
    want = torch.zeros(4, 6, 2, 5)
    want_grad = torch.empty(8, 2, 5)
    for i in range(4):
        want[i, :CU[i + 1] - CU[i]] = x.detach()[CU[i]:CU[i + 1]]
        want_grad[CU[i]:CU[i + 1]] = grad[i, :CU[i + 1] - CU[i]]
    assert torch.equal(bshd.detach(), want) and torch.equal(x.grad, want_grad)
