"""TE's context-parallel helpers for packed (THD) sequences: tex.thd_read_half_tensor, thd_second_half_lse_correction,
thd_read_second_half_lse, thd_out_correction, thd_grad_correction, thd_get_partitioned_indices and (TE >= 2.18) the
dual-chunk reorders and thd_copy_valid_tokens_from_per_split_to_rank_local. The bindings: csrc/extensions/attention.cpp
of TE 2.20.2's sdist, the same at tags v2.14 .. v2.18 and release_v2.19 but for 2.20's out_correction. The kernels:
common/fused_attn/context_parallel.cu at main d0067d0 (2.20.0.dev0; v2.14's kernels plus 2.18's three). TE 2.20.2's
header documents them alike, but its out_correction takes old_lse and its grad_correction adds a "zero" mode.

Each tensor is addressed as its shape laid out from its data pointer; a token is a row of the elements after the
token dim. cu_seqlens are int32 words divided (C's truncation) by 2 (halves), cp (partitions) or 1; token i belongs
to the sequence s the kernels' binary search gives (the first boundary among 1 .. b above i, less one), of length L
after the division; c = i - cu[s]. Definitions, for the tokens below cu[b]:
- read_half_tensor: half[i] = tensor[i + cu[s + half_idx]], per leading [2] slice.
- read_second_half_lse: half_lse[h, i] = lse[h, i + cu[s + 1]] (packed [h, t]) or half_lse[s, h, c] = lse[s, h, c + L]
  ([b, h, t]); second_half_lse_correction sets lse there to max + log1pf(expf(min - max)) of it and lse_per_step's.
- out_correction (TE < 2.20): out[i'] += (p == 0 ? 0 : dtype(float(p) * expf(lse_per_step - lse))) for each p of
  out_per_step[i], i' = i + cu[s + 1] with only_second_half (cu halved) else i; the LSEs placed as above.
- grad_correction: each half of each sequence "add"s (in the dtype), "copy"s or keeps ("none") grad_per_step's rows,
  half-length for (add|copy, none) and (none, add|copy), full-length for (add, copy) and (copy, add).
- partitions (cu divided by cp): rank r's token i is sequence-order row c + cu[s] cp + (L / 2) o, o = r in the first
  half of s, 2 (cp - 1) - r in the second; the reorders move rows between that rank order (rank r's at r t / cp) and
  sequence order. copy_valid_tokens: out[i] = inp[i] where i - padded[s] lies in 0 .. s's valid length.
Numerics: the file is built with --use_fast_math: fp32 ops flush subnormals (modelled), expf is __expf, ex2.approx of
x * log2e rounded to fp32 (the product modelled; 2^t correctly rounded here, MUFU.EX2 being within about 2 ulp);
log1pf is libdevice's (1 ulp), correctly rounded here; fp16 / bf16 adds are IEEE. Index and copy functions are bitwise.
Raised as TE raises: the NVTE_CHECKs, the dtype switches, empty launch grids, the partition kernel's device assert.
Refused (strict): TE 2.20's thd_out_correction and grad_correction's "zero" mode and FP8 byte gradients (kernels in
none of the sources above; the other grad modes are emulated under 2.20 as documented, with main's kernel); reads or
writes past a tensor's memory; a place two tokens write; half_idx not 0 / 1; [2, t, h, d] tensors with odd t (slices
half a token apart); head dims the 16-byte vectors do not tile; dims or dtypes the launchers would read as others.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from packaging.version import Version

from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.surface import installed_te_version
from te_verify.te.tecpu.writes import memory, write

FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # TRANSFORMER_ENGINE_TYPE_SWITCH_NON_FP8ONLY
TE_DTYPES = FLOATS + (torch.uint8, torch.bool, torch.int16, torch.int32, torch.int64, torch.float8_e4m3fn,
                      torch.float8_e5m2)  # GetTransformerEngineDType's
VECTOR = 16  # bytes of the kernels' float4 loads and stores
LOG2E = torch.tensor(1.4426950216293335, dtype=torch.float32)  # __expf's fp32 log2(e), 0x3FB8AA3B
NORMAL = 2.0 ** -126  # the smallest normal fp32: FTZ flushes smaller magnitudes to a signed zero
INCREMENTAL_SINCE = Version("2.20")  # out_correction takes old_lse; grad_correction has "zero" and FP8 bytes
GRAD_MODES = {("add", "none"): 0, ("copy", "none"): 0, ("none", "add"): 1, ("none", "copy"): 1,
              ("add", "copy"): 2, ("copy", "add"): 2}  # thd_grad_dispatcher's functor_idx


def _check(ok: bool, expr: str) -> None:
    if not ok:
        raise RuntimeError(f"Assertion failed: {expr}. ")


def _switch(x: torch.Tensor) -> None:
    if x.dtype not in FLOATS:
        raise RuntimeError(f"Unsupported dtype {x.dtype}. Expected one of: Float32, Float16, BFloat16.")


def _check_cu(cu: torch.Tensor, at_least: int = 0, name: str = "cu_seqlens") -> None:
    _check(cu.dtype == torch.int32, f"{name}.scalar_type() == at::ScalarType::Int")
    _check(cu.dim() == 1 and cu.size(0) >= at_least, f"{name}.dim() == 1 && {name}.size(0) >= {at_least}")


def _row_bytes(x: torch.Tensor, first: int) -> int:
    """The launchers' check that a token (the elements from dim `first` on) is whole 16-byte vectors; its elements."""
    if x.dtype not in TE_DTYPES:
        raise RuntimeError(f"Invalid type ({x.dtype}).")
    hidden = math.prod(x.shape[first:])
    _check(hidden * x.element_size() % VECTOR == 0, "hidden_size_in_bytes % 16 == 0")
    return hidden


def _words(cu: torch.Tensor, divisor: int, what: str) -> torch.Tensor:
    """The boundaries as the kernels hold them in shared memory: each int32 word divided with C's truncation."""
    return torch.div(memory(cu, what).to(torch.int64), divisor, rounding_mode="trunc")


def _search(bounds: torch.Tensor, what: str, tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, their sequences): binary_search(token, bounds, b + 1) of context_parallel.cu, step by step, for the
    tokens given or the kernels' usual loop over 0 .. cu[b] - 1."""
    if tokens is None and not bounds.numel():
        refuse(f"{what} with an empty cu_seqlens (the kernel reads its entry -1)")
    tokens = torch.arange(max(int(bounds[-1]), 0)) if tokens is None else tokens
    if bounds.numel() < 2 and tokens.numel():
        refuse(f"{what} with no sequence in cu_seqlens (the kernel reads past its boundaries)")
    left, right = torch.ones_like(tokens), torch.full_like(tokens, bounds.numel() - 1)
    while bool((active := left < right).any()):
        mid = (left + right) // 2
        above = bounds[mid] > tokens
        left, right = torch.where(active & ~above, mid + 1, left), torch.where(active & above, mid, right)
    return tokens, left - 1


def _within(what: str, *spans: tuple[torch.Tensor, int, str], written: torch.Tensor | None = None,
            grid: tuple[int, ...] = (1,)) -> None:
    """A launch grid with blocks; every index inside its tensor's memory; the places written each written once."""
    if min(grid) <= 0:
        raise RuntimeError(f"{what}: CUDA Error: invalid configuration argument (a launch grid of {grid} blocks)")
    for index, size, noun in spans:
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            refuse(f"{what} addressing {noun} {int(index.min())} .. {int(index.max())} of {size} (past its memory)")
    if written is not None and written.unique().numel() != written.numel():
        refuse(f"{what} writing the same place twice (a race on the GPU)")


def _scatter(dst: torch.Tensor, dim: int, index: torch.Tensor, values: torch.Tensor) -> None:
    """dst's entries `index` along dim set to values, in place as the kernels' stores."""
    write(dst, dst.clone().index_copy_(dim, index, values))


def _ftz(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.abs() < NORMAL, x * 0, x)


def _fast_exp(x: torch.Tensor) -> torch.Tensor:
    """__expf: ex2.approx.ftz of x * log2e rounded to fp32 (2^t correctly rounded here)."""
    return _ftz(torch.exp2(_ftz(x * LOG2E).double()).float())


def _merge(lse: torch.Tensor, lse_step: torch.Tensor) -> torch.Tensor:
    """LseCorrectionFunctor: max + log1pf(expf(min - max)) in fp32 (fmaxf / fminf: a NaN loses)."""
    high, low = torch.fmax(_ftz(lse), _ftz(lse_step)), torch.fmin(_ftz(lse), _ftz(lse_step))
    return _ftz(high + _ftz(torch.log1p(_fast_exp(_ftz(low - high)).double()).float()))


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The kernels' dtype add: add.ftz.f32 for fp32, IEEE (torch's, one rounding) for fp16 / bf16."""
    return _ftz(_ftz(a) + _ftz(b)) if a.dtype == torch.float32 else a + b


def _corrected(out: torch.Tensor, step: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """out + (step == 0 ? 0 : dtype(float(step) * scale)); fp32's compare flushes (setp.ftz), fp16 / bf16's not."""
    product = _ftz(_ftz(step.float()) * scale).to(out.dtype)
    return _add(out, torch.where((_ftz(step) if step.dtype == torch.float32 else step) == 0, 0.0, product))


def _lse_places(bounds, tokens, seq, heads, packed, seqlen, step_seqlen, shift):
    """(lse index, per-step index) per (token, head): the lse place `shift` halves of the sequence on."""
    head, tok, s = torch.arange(heads)[None, :], tokens[:, None], seq[:, None]
    if packed:
        return (head * seqlen + tok + bounds[s + 1] * shift).reshape(-1), (head * step_seqlen + tok).reshape(-1)
    row, col, length = s * heads + head, tok - bounds[s], bounds[s + 1] - bounds[s]
    return (row * seqlen + col + length * shift).reshape(-1), (row * step_seqlen + col).reshape(-1)


def thd_read_half_tensor(tensor: torch.Tensor, cu_seqlens: torch.Tensor, half_idx: int, /) -> torch.Tensor:
    what, seq_dim = "tex.thd_read_half_tensor", tensor.dim() - 3
    _check(tensor.dim() in (3, 4), "tensor.dim() == 3 || tensor.dim() == 4")
    _check_cu(cu_seqlens, 2)
    hidden, slices, t = _row_bytes(tensor, seq_dim + 1), (tensor.shape[0] if seq_dim else 1), tensor.shape[seq_dim]
    half = torch.empty(tensor.shape[:seq_dim] + (t // 2,) + tensor.shape[seq_dim + 1:], dtype=tensor.dtype,
                       device=EMULATED)
    if half_idx not in (0, 1) or (seq_dim and t % 2 and slices > 1):
        refuse(f"{what} with half_idx {half_idx} (the kernel reads cu_seqlens[s + half_idx]) or of a [2, t, h, d] "
               f"tensor with odd t {t} (its slices half a token apart)")
    bounds = _words(cu_seqlens, 2, what)
    tokens, seq = _search(bounds, what)
    source = tokens + bounds[seq + half_idx]
    _within(what, (tokens, t // 2, "half rows"), (source, t, "rows"), grid=(t // 2, slices))
    half.view(slices, t // 2, hidden)[:, tokens] = memory(tensor, what).view(slices, t, hidden)[:, source]
    return half


def _second_halves(lse: torch.Tensor, cu: torch.Tensor, packed: bool, step_seqlen: int,
                   what: str) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor]:
    """The binding's checks; ([b,] h, step_seqlen), the second halves' places in lse and in the per-step lse."""
    _check(lse.dtype == torch.float32, "lse.scalar_type() == at::ScalarType::Float")
    _check_cu(cu)
    _check(lse.dim() == (2 if packed else 3), f"lse.dim() == {2 if packed else 3}")
    seqlen, heads = lse.shape[-1], lse.shape[-2]
    _check(packed or cu.size(0) == lse.shape[0] + 1, "cu_seqlens.size(0) == batch + 1")
    _check(step_seqlen >= seqlen // 2 if packed else step_seqlen == seqlen // 2,
           "second_half_lse_seqlen >= (or, batch-major, ==) lse_seqlen / 2")
    bounds = _words(cu, 2, what)
    tokens, seq = _search(bounds, what)
    at, at_step = _lse_places(bounds, tokens, seq, heads, packed, seqlen, step_seqlen, 1)
    _within(what, (at, lse.numel(), "lse entries"), grid=(seqlen // 2, heads))
    return lse.shape[:-1] + (step_seqlen,), at, at_step


def thd_second_half_lse_correction(lse: torch.Tensor, lse_per_step: torch.Tensor, cu_seqlens: torch.Tensor,
                                   lse_packed: bool, /) -> None:
    what = "tex.thd_second_half_lse_correction"
    _check(lse_per_step.dtype == torch.float32, "lse_per_step.scalar_type() == at::ScalarType::Float")
    _check(lse_per_step.dim() == lse.dim(), "lse_per_step.dim() == lse.dim()")
    shape, at, at_step = _second_halves(lse, cu_seqlens, lse_packed, lse_per_step.shape[-1], what)
    _check(lse_per_step.shape[:-1] == shape[:-1], "lse_per_step's [b,] h == lse's")
    _within(what, (at_step, lse_per_step.numel(), "lse_per_step entries"), written=at)
    flat = memory(lse, what)
    _scatter(flat, 0, at, _merge(flat[at], memory(lse_per_step, what)[at_step]))


def thd_read_second_half_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor, lse_packed: bool,
                             second_half_lse_seqlen: int, /) -> torch.Tensor:
    what = "tex.thd_read_second_half_lse"
    shape, at, at_half = _second_halves(lse, cu_seqlens, lse_packed, second_half_lse_seqlen, what)
    half_lse = torch.zeros(shape, dtype=torch.float32, device=EMULATED)
    _within(what, (at_half, half_lse.numel(), "half_lse entries"), written=at_half)
    half_lse.view(-1)[at_half] = memory(lse, what)[at]
    return half_lse


def thd_out_correction(*args: Any) -> None:
    """TE < 2.20's (out, out_per_step, lse, lse_per_step, cu_seqlens, only_second_half, lse_packed)."""
    if installed_te_version() >= INCREMENTAL_SINCE:
        refuse(f"tex.thd_out_correction of TE {installed_te_version()} (the incremental correction taking old_lse: its kernel "
               "is in none of the sources the emulation is written from)")
    _out_correction(*args)


def _out_correction(out: torch.Tensor, out_per_step: torch.Tensor, lse: torch.Tensor, lse_per_step: torch.Tensor,
                    cu_seqlens: torch.Tensor, only_second_half: bool, lse_packed: bool, /) -> None:
    what, halves, dims = "tex.thd_out_correction", (2 if only_second_half else 1), (2 if lse_packed else 3)
    _switch(out)
    _check(out.dtype == out_per_step.dtype, "out.dtype() == out_per_step.dtype()")
    _check(lse.dtype == lse_per_step.dtype == torch.float32, "lse.dtype() == lse_per_step.dtype() == kFloat32")
    _check(cu_seqlens.dtype == torch.int32, "cu_seqlens.dtype() == DType::kInt32")
    shapes = (out.dim(), out_per_step.dim(), lse.dim(), lse_per_step.dim(), cu_seqlens.dim())
    if shapes != (3, 3, dims, dims, 1) or out.shape[2] * out.element_size() % VECTOR:
        refuse(f"{what} with out, out_per_step, lse, lse_per_step, cu_seqlens of {shapes} dims (the launcher reads "
               f"[t, h, d] and {dims}-D LSEs) or out {tuple(out.shape)} of {out.dtype} (heads not 16-byte vectors)")
    (total, heads, dim), seqlen, step_seqlen = out.shape, lse.shape[-1], lse_per_step.shape[-1]
    _check(out_per_step.shape == (total // halves, heads, dim), "out_per_step is [t / (only_second_half + 1), h, d]")
    if lse_packed:
        _check(lse.shape[0] == lse_per_step.shape[0] == heads, "lse's and lse_per_step's h")
        _check(seqlen >= total and step_seqlen >= seqlen // halves, "lse_seqlen, lse_per_step_seqlen large enough")
    else:
        _check(lse.shape[1] == heads and lse_per_step.shape[:2] == lse.shape[:2], "lse's and lse_per_step's [b, h]")
        _check(step_seqlen == seqlen // halves and cu_seqlens.size(0) == lse.shape[0] + 1, "lse_per_step's shape")
    bounds = _words(cu_seqlens, halves, what)
    tokens, seq = _search(bounds, what)
    at, at_step = _lse_places(bounds, tokens, seq, heads, lse_packed, seqlen, step_seqlen, halves - 1)
    rows = tokens + bounds[seq + 1] * (halves - 1)
    _within(what, (at, lse.numel(), "lse entries"), (at_step, lse_per_step.numel(), "lse_per_step entries"),
            (rows, total, "out rows"), (tokens, total // halves, "out_per_step rows"), written=rows,
            grid=(total // halves, heads))
    scale = _fast_exp(_ftz(_ftz(memory(lse_per_step, what)[at_step]) - _ftz(memory(lse, what)[at])))
    target = memory(out, what).view(total, heads, dim)
    step = memory(out_per_step, what).view(-1, heads, dim)[tokens]
    _scatter(target, 0, rows, _corrected(target[rows], step, scale.view(-1, heads, 1)))


def thd_grad_correction(grad: torch.Tensor, grad_per_step: torch.Tensor, cu_seqlens: torch.Tensor,
                        first_half: str, second_half: str, /) -> None:
    what, modes = "tex.thd_grad_correction", (first_half, second_half)
    if installed_te_version() >= INCREMENTAL_SINCE and (grad.dtype not in FLOATS or "zero" in modes):
        refuse(f"{what} {modes} of {grad.dtype} under TE {installed_te_version()} (its 'zero' mode and FP8 byte gradients: "
               "the kernel is in none of the sources the emulation is written from)")
    _switch(grad)
    if modes not in GRAD_MODES:
        raise RuntimeError("Unsupported Functor of first half and second_half\n")
    functor, seq_dim = GRAD_MODES[modes], grad.dim() - 3
    _check(grad.dim() in (3, 4), "grad.dim() == 3 || grad.dim() == 4")
    _check_cu(cu_seqlens)
    if grad_per_step.dim() != grad.dim() or grad_per_step.dtype != grad.dtype:
        refuse(f"{what} with a {grad_per_step.dim()}-D {grad_per_step.dtype} grad_per_step, a {grad.dim()}-D "
               f"{grad.dtype} grad (the kernel reads grad_per_step's memory as grad's)")
    total, heads, dim = grad.shape[seq_dim:]
    rows = total // 2 if functor < 2 else total
    _check(grad_per_step.shape[seq_dim:] == (rows, heads, dim), "grad_per_step is [t (or t / 2), h, d]")
    hidden, slices = _row_bytes(grad, seq_dim + 1), (grad.shape[0] if seq_dim else 1)
    if (seq_dim and functor < 2 and total % 2 and slices > 1) or grad_per_step.numel() < slices * rows * hidden:
        refuse(f"{what} of {tuple(grad.shape)} gradients (per-step slices half a token apart, or past its memory)")
    bounds = _words(cu_seqlens, 2 if functor < 2 else 1, what)
    tokens, seq = _search(bounds, what)
    if functor < 2:
        target, first = tokens + bounds[seq + functor], torch.full_like(tokens, functor == 0, dtype=torch.bool)
    else:
        target = tokens
        first = tokens - bounds[seq] < torch.div(bounds[seq + 1] - bounds[seq], 2, rounding_mode="trunc")
    _within(what, (target, total, "grad rows"), (tokens, rows, "grad_per_step rows"), written=target,
            grid=(rows, slices))
    dst = memory(grad, what).view(slices, total, hidden)
    src = memory(grad_per_step, what)[:slices * rows * hidden].view(slices, rows, hidden)[:, tokens]
    old = dst[:, target]
    new, summed = old.clone(), _add(old, src)
    for mode, mask in zip(modes, (first, ~first)):
        if mode != "none":
            new[:, mask] = (src if mode == "copy" else summed)[:, mask]
    _scatter(dst, 1, target, new)


def _partition_source(tokens: torch.Tensor, rank: Any, bounds: torch.Tensor, world: int, what: str) -> torch.Tensor:
    """thd_partition_src_index: the sequence-order row of rank `rank`'s token (bounds divided by world)."""
    seq = _search(bounds, what, tokens)[1]
    start = bounds[seq]
    index, half = tokens - start, torch.div(bounds[seq + 1] - start, 2, rounding_mode="trunc")
    return index + start * world + half * torch.where(index < half, rank, 2 * (world - 1) - rank)


def _check_partition(cu: torch.Tensor, world: int, total: int) -> None:
    _check_cu(cu, 2)
    _check(world > 0 and total > 0 and total % (world * 2) == 0,
           "world_size > 0 && total_tokens > 0 && total_tokens % (world_size * 2) == 0")


def thd_get_partitioned_indices(cu_seqlens: torch.Tensor, total_tokens: int, world_size: int, rank: int,
                                /) -> torch.Tensor:
    what = "tex.thd_get_partitioned_indices"
    _check_cu(cu_seqlens, 2)
    _check(0 <= rank < world_size, "rank >= 0 && rank < world_size")
    _check_partition(cu_seqlens, world_size, total_tokens)
    cu = _words(cu_seqlens, 1, what)
    if bool((cu % (2 * world_size) != 0).any()):
        raise RuntimeError("CUDA error: device-side assert triggered (thd_partition_indices_kernel: Assertion "
                           "`seqlen % (world_size * 2) == 0` failed)")
    tokens = torch.arange(total_tokens // world_size)
    return _partition_source(tokens, rank, cu // world_size, world_size, what).to(torch.int32)


def _reorder(inp: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int, total_tokens: int, to_sequence: bool,
             what: str) -> torch.Tensor:
    _check_partition(cu_seqlens, cp_size, total_tokens)
    _check(inp.dim() >= 1 and inp.size(0) == total_tokens, "inp.dim() >= 1 && inp.size(0) == total_tokens")
    hidden, per_rank, rows = _row_bytes(inp, 1), total_tokens // cp_size, torch.arange(total_tokens)
    source = _partition_source(rows % per_rank, rows // per_rank, _words(cu_seqlens, cp_size, what), cp_size, what)
    _within(what, (source, total_tokens, "rows"), written=source if to_sequence else None)
    out = torch.empty_like(inp, device=EMULATED, memory_format=torch.contiguous_format)
    read, written = (rows, source) if to_sequence else (source, rows)
    out.view(total_tokens, hidden)[written] = inp.contiguous().view(total_tokens, hidden)[read]
    return out


def thd_sequence_order_to_cp_rank_order(inp: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int,
                                        total_tokens: int, /) -> torch.Tensor:
    return _reorder(inp, cu_seqlens, cp_size, total_tokens, False, "tex.thd_sequence_order_to_cp_rank_order")


def thd_cp_rank_order_to_sequence_order(inp: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int,
                                        total_tokens: int, /) -> torch.Tensor:
    return _reorder(inp, cu_seqlens, cp_size, total_tokens, True, "tex.thd_cp_rank_order_to_sequence_order")


def thd_copy_valid_tokens_from_per_split_to_rank_local(out: torch.Tensor, inp: torch.Tensor,
                                                       cu_seqlens_padded: torch.Tensor, cu_seqlens: torch.Tensor,
                                                       /) -> None:
    what = "tex.thd_copy_valid_tokens_from_per_split_to_rank_local"
    _check_cu(cu_seqlens, 2)
    _check_cu(cu_seqlens_padded, name="cu_seqlens_padded")
    _check(cu_seqlens_padded.size(0) == cu_seqlens.size(0), "cu_seqlens_padded.size(0) == cu_seqlens.size(0)")
    _check(inp.dim() >= 1 and out.shape == inp.shape and out.dtype == inp.dtype, "out matches inp's sizes and type")
    if not out.is_contiguous():
        raise RuntimeError(f"Assertion failed: out.is_contiguous(). {what[4:]} output must be contiguous.")
    _check(inp.size(0) > 0, "total_tokens > 0")
    total, hidden = inp.size(0), _row_bytes(inp, 1)
    padded, valid, tokens = _words(cu_seqlens_padded, 1, what), _words(cu_seqlens, 1, what), torch.arange(total)
    seq = _search(padded, what, tokens)[1]
    local = tokens - padded[seq]
    rows = tokens[(local >= 0) & (local < valid[seq + 1] - valid[seq])]
    _scatter(out.view(total, hidden), 0, rows, inp.contiguous().view(total, hidden)[rows])


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name (tex.build exposes those the version's surface has)."""
    return {fn.__name__: fn for fn in (
        thd_read_half_tensor, thd_second_half_lse_correction, thd_read_second_half_lse, thd_out_correction,
        thd_grad_correction, thd_get_partitioned_indices, thd_sequence_order_to_cp_rank_order,
        thd_cp_rank_order_to_sequence_order, thd_copy_valid_tokens_from_per_split_to_rank_local)}
