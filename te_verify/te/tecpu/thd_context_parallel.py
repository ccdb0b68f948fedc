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

from typing import Any

import torch
from packaging.version import Version

from te_verify.te.tecpu import thd_layout as layout
from te_verify.te.tecpu.device import EMULATED
from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.surface import installed_te_version
from te_verify.te.tecpu.writes import memory

LOG2E = torch.tensor(1.4426950216293335, dtype=torch.float32)  # __expf's fp32 log2(e), 0x3FB8AA3B
NORMAL = 2.0 ** -126  # the smallest normal fp32: FTZ flushes smaller magnitudes to a signed zero
INCREMENTAL_SINCE = Version("2.20")  # out_correction takes old_lse; grad_correction has "zero" and FP8 bytes
GRAD_MODES = {("add", "none"): 0, ("copy", "none"): 0, ("none", "add"): 1, ("none", "copy"): 1,
              ("add", "copy"): 2, ("copy", "add"): 2}  # thd_grad_dispatcher's functor_idx


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
    layout.check(tensor.dim() in (3, 4), "tensor.dim() == 3 || tensor.dim() == 4")
    layout.check_cu(cu_seqlens, 2)
    hidden, t = layout.row_bytes(tensor, seq_dim + 1), tensor.shape[seq_dim]
    slices = tensor.shape[0] if seq_dim else 1
    half = torch.empty(tensor.shape[:seq_dim] + (t // 2,) + tensor.shape[seq_dim + 1:], dtype=tensor.dtype,
                       device=EMULATED)
    if half_idx not in (0, 1) or (seq_dim and t % 2 and slices > 1):
        refuse(f"{what} with half_idx {half_idx} (the kernel reads cu_seqlens[s + half_idx]) or of a [2, t, h, d] "
               f"tensor with odd t {t} (its slices half a token apart)")
    bounds = layout.words(cu_seqlens, 2, what)
    tokens, seq = layout.search(bounds, what)
    source = tokens + bounds[seq + half_idx]
    layout.within(what, (tokens, t // 2, "half rows"), (source, t, "rows"), grid=(t // 2, slices))
    half.view(slices, t // 2, hidden)[:, tokens] = memory(tensor, what).view(slices, t, hidden)[:, source]
    return half


def _second_halves(lse: torch.Tensor, cu: torch.Tensor, packed: bool, step_seqlen: int,
                   what: str) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor]:
    """The binding's checks; ([b,] h, step_seqlen), the second halves' places in lse and in the per-step lse."""
    layout.check(lse.dtype == torch.float32, "lse.scalar_type() == at::ScalarType::Float")
    layout.check_cu(cu)
    layout.check(lse.dim() == (2 if packed else 3), f"lse.dim() == {2 if packed else 3}")
    seqlen, heads = lse.shape[-1], lse.shape[-2]
    layout.check(packed or cu.size(0) == lse.shape[0] + 1, "cu_seqlens.size(0) == batch + 1")
    layout.check(step_seqlen >= seqlen // 2 if packed else step_seqlen == seqlen // 2,
           "second_half_lse_seqlen >= (or, batch-major, ==) lse_seqlen / 2")
    bounds = layout.words(cu, 2, what)
    tokens, seq = layout.search(bounds, what)
    at, at_step = _lse_places(bounds, tokens, seq, heads, packed, seqlen, step_seqlen, 1)
    layout.within(what, (at, lse.numel(), "lse entries"), grid=(seqlen // 2, heads))
    return lse.shape[:-1] + (step_seqlen,), at, at_step


def thd_second_half_lse_correction(lse: torch.Tensor, lse_per_step: torch.Tensor, cu_seqlens: torch.Tensor,
                                   lse_packed: bool, /) -> None:
    what = "tex.thd_second_half_lse_correction"
    layout.check(lse_per_step.dtype == torch.float32, "lse_per_step.scalar_type() == at::ScalarType::Float")
    layout.check(lse_per_step.dim() == lse.dim(), "lse_per_step.dim() == lse.dim()")
    shape, at, at_step = _second_halves(lse, cu_seqlens, lse_packed, lse_per_step.shape[-1], what)
    layout.check(lse_per_step.shape[:-1] == shape[:-1], "lse_per_step's [b,] h == lse's")
    layout.within(what, (at_step, lse_per_step.numel(), "lse_per_step entries"), written=at)
    flat = memory(lse, what)
    layout.scatter(flat, 0, at, _merge(flat[at], memory(lse_per_step, what)[at_step]))


def thd_read_second_half_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor, lse_packed: bool,
                             second_half_lse_seqlen: int, /) -> torch.Tensor:
    what = "tex.thd_read_second_half_lse"
    shape, at, at_half = _second_halves(lse, cu_seqlens, lse_packed, second_half_lse_seqlen, what)
    half_lse = torch.zeros(shape, dtype=torch.float32, device=EMULATED)
    layout.within(what, (at_half, half_lse.numel(), "half_lse entries"), written=at_half)
    half_lse.view(-1)[at_half] = memory(lse, what)[at]
    return half_lse


def thd_out_correction(*args: Any) -> None:
    """TE < 2.20's (out, out_per_step, lse, lse_per_step, cu_seqlens, only_second_half, lse_packed)."""
    if installed_te_version() >= INCREMENTAL_SINCE:
        refuse(f"tex.thd_out_correction of TE {installed_te_version()} (the incremental correction taking old_lse: "
               "its kernel "
               "is in none of the sources the emulation is written from)")
    _out_correction(*args)


def _out_correction(out: torch.Tensor, out_per_step: torch.Tensor, lse: torch.Tensor, lse_per_step: torch.Tensor,
                    cu_seqlens: torch.Tensor, only_second_half: bool, lse_packed: bool, /) -> None:
    what, halves, dims = "tex.thd_out_correction", (2 if only_second_half else 1), (2 if lse_packed else 3)
    layout.switch(out)
    layout.check(out.dtype == out_per_step.dtype, "out.dtype() == out_per_step.dtype()")
    layout.check(lse.dtype == lse_per_step.dtype == torch.float32, "lse.dtype() == lse_per_step.dtype() == kFloat32")
    layout.check(cu_seqlens.dtype == torch.int32, "cu_seqlens.dtype() == DType::kInt32")
    shapes = (out.dim(), out_per_step.dim(), lse.dim(), lse_per_step.dim(), cu_seqlens.dim())
    if shapes != (3, 3, dims, dims, 1) or out.shape[2] * out.element_size() % layout.VECTOR:
        refuse(f"{what} with out, out_per_step, lse, lse_per_step, cu_seqlens of {shapes} dims (the launcher reads "
               f"[t, h, d] and {dims}-D LSEs) or out {tuple(out.shape)} of {out.dtype} (heads not 16-byte vectors)")
    (total, heads, dim), seqlen, step_seqlen = out.shape, lse.shape[-1], lse_per_step.shape[-1]
    layout.check(out_per_step.shape == (total // halves, heads, dim),
                 "out_per_step is [t / (only_second_half + 1), h, d]")
    if lse_packed:
        layout.check(lse.shape[0] == lse_per_step.shape[0] == heads, "lse's and lse_per_step's h")
        layout.check(seqlen >= total and step_seqlen >= seqlen // halves,
                     "lse_seqlen, lse_per_step_seqlen large enough")
    else:
        layout.check(lse.shape[1] == heads and lse_per_step.shape[:2] == lse.shape[:2],
                     "lse's and lse_per_step's [b, h]")
        layout.check(step_seqlen == seqlen // halves and cu_seqlens.size(0) == lse.shape[0] + 1, "lse_per_step's shape")
    bounds = layout.words(cu_seqlens, halves, what)
    tokens, seq = layout.search(bounds, what)
    at, at_step = _lse_places(bounds, tokens, seq, heads, lse_packed, seqlen, step_seqlen, halves - 1)
    rows = tokens + bounds[seq + 1] * (halves - 1)
    layout.within(what, (at, lse.numel(), "lse entries"), (at_step, lse_per_step.numel(), "lse_per_step entries"),
            (rows, total, "out rows"), (tokens, total // halves, "out_per_step rows"), written=rows,
            grid=(total // halves, heads))
    scale = _fast_exp(_ftz(_ftz(memory(lse_per_step, what)[at_step]) - _ftz(memory(lse, what)[at])))
    target = memory(out, what).view(total, heads, dim)
    step = memory(out_per_step, what).view(-1, heads, dim)[tokens]
    layout.scatter(target, 0, rows, _corrected(target[rows], step, scale.view(-1, heads, 1)))


def thd_grad_correction(grad: torch.Tensor, grad_per_step: torch.Tensor, cu_seqlens: torch.Tensor,
                        first_half: str, second_half: str, /) -> None:
    what, modes = "tex.thd_grad_correction", (first_half, second_half)
    if installed_te_version() >= INCREMENTAL_SINCE and (grad.dtype not in layout.FLOATS or "zero" in modes):
        refuse(f"{what} {modes} of {grad.dtype} under TE {installed_te_version()} (its 'zero' mode and FP8 byte "
               "gradients: "
               "the kernel is in none of the sources the emulation is written from)")
    layout.switch(grad)
    if modes not in GRAD_MODES:
        raise RuntimeError("Unsupported Functor of first half and second_half\n")
    functor, seq_dim = GRAD_MODES[modes], grad.dim() - 3
    layout.check(grad.dim() in (3, 4), "grad.dim() == 3 || grad.dim() == 4")
    layout.check_cu(cu_seqlens)
    if grad_per_step.dim() != grad.dim() or grad_per_step.dtype != grad.dtype:
        refuse(f"{what} with a {grad_per_step.dim()}-D {grad_per_step.dtype} grad_per_step, a {grad.dim()}-D "
               f"{grad.dtype} grad (the kernel reads grad_per_step's memory as grad's)")
    total, heads, dim = grad.shape[seq_dim:]
    rows = total // 2 if functor < 2 else total
    layout.check(grad_per_step.shape[seq_dim:] == (rows, heads, dim), "grad_per_step is [t (or t / 2), h, d]")
    hidden, slices = layout.row_bytes(grad, seq_dim + 1), (grad.shape[0] if seq_dim else 1)
    if (seq_dim and functor < 2 and total % 2 and slices > 1) or grad_per_step.numel() < slices * rows * hidden:
        refuse(f"{what} of {tuple(grad.shape)} gradients (per-step slices half a token apart, or past its memory)")
    bounds = layout.words(cu_seqlens, 2 if functor < 2 else 1, what)
    tokens, seq = layout.search(bounds, what)
    if functor < 2:
        target, first = tokens + bounds[seq + functor], torch.full_like(tokens, functor == 0, dtype=torch.bool)
    else:
        target = tokens
        first = tokens - bounds[seq] < torch.div(bounds[seq + 1] - bounds[seq], 2, rounding_mode="trunc")
    layout.within(what, (target, total, "grad rows"), (tokens, rows, "grad_per_step rows"), written=target,
            grid=(rows, slices))
    dst = memory(grad, what).view(slices, total, hidden)
    src = memory(grad_per_step, what)[:slices * rows * hidden].view(slices, rows, hidden)[:, tokens]
    old = dst[:, target]
    new, summed = old.clone(), _add(old, src)
    for mode, mask in zip(modes, (first, ~first)):
        if mode != "none":
            new[:, mask] = (src if mode == "copy" else summed)[:, mask]
    layout.scatter(dst, 1, target, new)


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name (tex.build exposes those the version's surface has)."""
    return {fn.__name__: fn for fn in (
        thd_read_half_tensor, thd_second_half_lse_correction, thd_read_second_half_lse, thd_out_correction,
        thd_grad_correction)}
