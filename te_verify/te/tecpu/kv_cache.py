"""tex's KV cache and THD conversions: copy_to_kv_cache, convert_thd_to_bshd, convert_bshd_to_thd, as
csrc/extensions/attention.cpp and common/fused_attn/kv_cache.cu define them (main d0067d0; kernels, bindings and
positional-only arguments the same from TE 2.8 on). TE's InferenceParams.step reaches the first (non-paged and paged
caches), attention with THD inputs the other two (backends.py, dot_product_attention/utils.py).

The kernels address memory, not strides: each tensor is read as its shape laid out contiguously from its data
pointer, in rows of h * d elements (a token). Definitions, b sequences:
- convert_thd_to_bshd: zeros [b, max_seq_len, h, d]; sequence i's cu[i+1] - cu[i] tokens from THD row cu[i] to
  BSHD row i * max_seq_len. convert_bshd_to_thd: zeros [t, h, d]; the same tokens the other way (b, max_seq_len:
  the input's first two dims).
- copy_to_kv_cache, caches in bshd (rows of h_kv * d_k and h_kv * d_v, h_kv and d_k from new_k, d_v from new_v),
  page_size = max_seq_len / max_pages_per_seq: sequence i has new = cu_new[i+1] - cu_new[i] tokens, ending at
  cached = cu_cached[i+1] - cu_cached[i]; its token j lands at position p = cached - new + j, cache row
  page * page_size + p % page_size, page = i (non-paged) or page_table[i, p / page_size]; it is read from new_k row
  i * max_ctx_len + j (bshd), j * b + i (sbhd) or cu_new[i] + j (thd). Non-paged, a reindexing pass runs first:
  page_table holds batch_indices; up to the last descent of batch_indices[0..b), sequence i (all of them when
  batch_indices[0] != 0, else those with batch_indices[i] - batch_indices[0] != i) gets its cached - new earlier
  tokens copied from cache row block batch_indices[i] to block i, sequence by sequence (one thread owns an element of
  a token position across all sequences, so the sequential order is the kernel's). Nothing runs when one of the four
  data tensors is a 1-D empty tensor (TensorWrapper::has_data).
Raised as TE raises: the binding's and launcher's checks, the dtype switch (fp32, fp16, bf16, FP8 E4M3/E5M2).
Refused (strict): index tensors other than int32 (the kernels read int32 words); reads or writes past a tensor's
memory; rows two sequences (or tokens) write at once (a race on the GPU); a position before the cache's start; grids
the GPU cannot launch (b or max_ctx_len outside 1 .. 65535 for the copy, max_seq_len < 1 for the reindexing); a page
size of 0; caches sharing memory with each other or with the new tokens.
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import memory, write

DATA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
FORMATS = {"NVTE_BSHD": "bshd", "NVTE_SBHD": "sbhd", "NVTE_THD": "thd"}
MAX_GRID_Y = 65535  # gridDim.y limit: the copy's grid is (b, max_ctx_len)


def _dtype_switch(dtype: torch.dtype) -> None:
    """TRANSFORMER_ENGINE_TYPE_SWITCH_FLOAT's error for any other dtype."""
    if dtype not in DATA_DTYPES:
        raise RuntimeError(f"Unsupported dtype {dtype}. Expected one of: Float32, Float16, BFloat16, Float8E4M3, "
                           f"Float8E5M2.")


def int32_words(x: torch.Tensor, count: int, what: str) -> list[int]:
    """The first `count` int32 words of an index tensor, as the kernels read them."""
    if x.dtype != torch.int32:
        refuse(f"{what} with {x.dtype} index tensors (the kernels read int32 words)")
    if x.numel() < count:
        refuse(f"{what} reading {count} words of a {x.numel()}-element index tensor (past its memory)")
    return memory(x)[:count].tolist()


def _rows(flat: torch.Tensor, width: int, first: int, count: int, what: str) -> torch.Tensor:
    """Rows first .. first + count of `width` elements of a flat tensor; out-of-memory rows are refused."""
    if first < 0 or (first + count) * width > flat.numel():
        refuse(f"{what} touching rows {first} .. {first + count - 1} of {width} elements past a tensor's "
               f"{flat.numel()} elements")
    return flat[first * width:(first + count) * width]


def _refuse_overlaps(spans: list[tuple[int, int]], what: str) -> None:
    """Spans (start, length) of rows written by different threads at once must be disjoint."""
    ordered = sorted(s for s in spans if s[1] > 0)
    for (a, n), (c, _) in zip(ordered, ordered[1:]):
        if a + n > c:
            refuse(f"{what} writing rows {c} .. {a + n - 1} twice (a race on the GPU)")


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory the kernels see of a and b (numel elements from each data pointer) overlaps."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def convert_thd_to_bshd(tensor: torch.Tensor, cu_seqlens: torch.Tensor, b: int, max_seq_len: int, /) -> torch.Tensor:
    """[t, h, d] packed tokens -> [b, max_seq_len, h, d], zeros past each sequence's length."""
    h, d = tensor.size(1), tensor.size(2)
    out = torch.zeros(b, max_seq_len, h, d, dtype=tensor.dtype, device=EMULATED)
    _dtype_switch(out.dtype)
    cu = int32_words(cu_seqlens, b + 1 if b > 0 else 0, "tex.convert_thd_to_bshd")
    lengths = [cu[i + 1] - cu[i] for i in range(b)]
    if any(n > max_seq_len for n in lengths):
        refuse(f"tex.convert_thd_to_bshd with a sequence longer than max_seq_len {max_seq_len} ({max(lengths)} "
               f"tokens: the kernel's blocks would write each other's rows)")
    source, target = memory(tensor), memory(out)
    for i, n in enumerate(lengths):
        if n > 0:
            rows = _rows(source, h * d, cu[i], n, "tex.convert_thd_to_bshd")
            write(_rows(target, h * d, i * max_seq_len, n, "tex.convert_thd_to_bshd"), rows)
    return out


def convert_bshd_to_thd(tensor: torch.Tensor, cu_seqlens: torch.Tensor, t: int, /) -> torch.Tensor:
    """[b, s, h, d] padded sequences -> [t, h, d], each sequence's cu[i+1] - cu[i] first tokens packed."""
    h, d = tensor.size(2), tensor.size(3)
    out = torch.zeros(t, h, d, dtype=tensor.dtype, device=EMULATED)
    _dtype_switch(tensor.dtype)
    b, max_seq_len = tensor.shape[0], tensor.shape[1]
    cu = int32_words(cu_seqlens, b + 1 if b > 0 else 0, "tex.convert_bshd_to_thd")
    spans = [(cu[i], cu[i + 1] - cu[i]) for i in range(b)]
    _refuse_overlaps(spans, "tex.convert_bshd_to_thd")
    source, target = memory(tensor), memory(out)
    for i, (start, n) in enumerate(spans):
        if n > 0:
            rows = _rows(source, h * d, i * max_seq_len, n, "tex.convert_bshd_to_thd")
            write(_rows(target, h * d, start, n, "tex.convert_bshd_to_thd"), rows)
    return out


def _reindex_moves(batch_indices: list[int], cached: list[int], new: list[int],
                   max_seq_len: int) -> list[tuple[int, int, int]]:
    """reindex_kv_cache_kernel's copies, in its order: (source row, target row, tokens) per sequence moved."""
    b = len(batch_indices)
    last = b
    for i in range(b - 1):
        if batch_indices[i + 1] < batch_indices[i]:
            last = i + 1
    every = batch_indices[0] != 0
    moves = []
    for i in range(last):
        tokens = cached[i] - new[i]
        if tokens <= 0 or (not every and batch_indices[i] - batch_indices[0] == i):
            continue
        if tokens > max_seq_len:
            refuse(f"tex.copy_to_kv_cache reindexing {tokens} cached tokens into blocks of max_seq_len "
                   f"{max_seq_len} (the kernel's blocks would overlap)")
        moves.append((batch_indices[i] * max_seq_len, i * max_seq_len, tokens))
    return moves


def _token_runs(sources: list[int], targets: list[int]) -> list[tuple[int, int, int]]:
    """(source row, target row, count) runs where both advance by one row per token."""
    runs: list[list[int]] = []
    for s, t in zip(sources, targets):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == t:
            runs[-1][2] += 1
        else:
            runs.append([s, t, 1])
    return [tuple(r) for r in runs]


def copy_to_kv_cache(new_k: torch.Tensor, new_v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     page_table: torch.Tensor, cu_new_lens: torch.Tensor, cu_cached_lens: torch.Tensor,
                     qkv_format: Any, b: int, max_ctx_len: int, max_seq_len: int, max_pages_per_seq: int,
                     is_non_paged: bool, /) -> None:
    """The new tokens written into the bshd caches in place (after the non-paged reindexing)."""
    import transformer_engine_torch as tex  # the emulated module: its enum carries the version's values
    if not (k_cache.dtype == v_cache.dtype and new_k.dtype == new_v.dtype and new_k.dtype == k_cache.dtype):
        raise RuntimeError("new_k, new_v, k_cache and v_cache must be of the same data type.")
    if not isinstance(qkv_format, tex.NVTE_QKV_Format):
        raise TypeError(f"copy_to_kv_cache(): incompatible function arguments (qkv_format {qkv_format!r})")
    layout = FORMATS.get(qkv_format.name)
    if layout is None:
        raise RuntimeError("qkv_format must be {BSHD, SBHD, THD}.")
    if new_k.dim() < 2 or new_v.dim() < 1:
        refuse(f"tex.copy_to_kv_cache with new_k of shape {tuple(new_k.shape)} (no [..., h, d] token rows)")
    h_kv, d_k, d_v = new_k.shape[-2], new_k.shape[-1], new_v.shape[-1]
    _dtype_switch(k_cache.dtype)
    if any(x.dim() == 1 and x.numel() == 0 for x in (new_k, new_v, k_cache, v_cache)):
        return  # the launcher's has_data() guard: no kernel runs
    what = "tex.copy_to_kv_cache"
    if any(_shares(c, x) for c in (k_cache, v_cache) for x in (new_k, new_v)) or _shares(k_cache, v_cache):
        refuse(f"{what} with caches sharing memory with each other or with the new tokens")
    if not (1 <= b <= MAX_GRID_Y and 1 <= max_ctx_len <= MAX_GRID_Y) or (is_non_paged and max_seq_len < 1):
        refuse(f"{what} with b {b}, max_ctx_len {max_ctx_len}, max_seq_len {max_seq_len} (a grid the GPU cannot "
               f"launch)")
    if max_pages_per_seq < 1 or max_seq_len < max_pages_per_seq:
        refuse(f"{what} with max_seq_len {max_seq_len} over {max_pages_per_seq} pages (a page size below 1)")
    page_size = max_seq_len // max_pages_per_seq
    cu_new = int32_words(cu_new_lens, b + 1, what)
    cu_cached = int32_words(cu_cached_lens, b + 1, what)
    new = [cu_new[i + 1] - cu_new[i] for i in range(b)]
    cached = [cu_cached[i + 1] - cu_cached[i] for i in range(b)]
    caches = [(memory(k_cache), h_kv * d_k), (memory(v_cache), h_kv * d_v)]
    moves = _reindex_moves(int32_words(page_table, b, what), cached, new, max_seq_len) if is_non_paged else []
    table = [] if is_non_paged else int32_words(page_table, page_table.numel(), what)
    sources, targets = [], []
    for i in range(b):
        first = cached[i] - new[i]
        if new[i] > 0 and first < 0:
            refuse(f"{what} with {new[i]} new tokens but {cached[i]} cached for sequence {i} (a position before "
                   f"the cache's start)")
        for j in range(max(new[i], 0)):
            p = first + j
            entry = i * max_pages_per_seq + p // page_size
            if not is_non_paged and entry >= len(table):
                refuse(f"{what} reading page_table entry {entry} of {len(table)} (past its memory)")
            page = i if is_non_paged else table[entry]
            targets.append(page * page_size + p % page_size)
            sources.append({"bshd": i * max_ctx_len + j, "sbhd": j * b + i, "thd": cu_new[i] + j}[layout])
    _refuse_overlaps([(t, 1) for t in targets], what)
    copies = [(cache, width, fresh, _token_runs(sources, targets))
              for (cache, width), fresh in zip(caches, (memory(new_k), memory(new_v))) if width]
    for cache, width, fresh, runs in copies:  # every row checked before the first write
        for s, t, n in moves:
            _rows(cache, width, s, n, what), _rows(cache, width, t, n, what)
        for s, t, n in runs:
            _rows(cache, width, t, n, what), _rows(fresh, width, s, n, what)
    for cache, width, _, _ in copies:  # the reindexing kernel, sequence by sequence
        for s, t, n in moves:
            write(_rows(cache, width, t, n, what), _rows(cache, width, s, n, what).clone())
    for cache, width, fresh, runs in copies:  # then the copy kernel
        for s, t, n in runs:
            write(_rows(cache, width, t, n, what), _rows(fresh, width, s, n, what))


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {"copy_to_kv_cache": copy_to_kv_cache, "convert_thd_to_bshd": convert_thd_to_bshd,
            "convert_bshd_to_thd": convert_bshd_to_thd}
