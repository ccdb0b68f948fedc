"""tex's fused rotary position embedding (TE's FusedRoPEFunc and FusedQKVRoPEFunc, attention/rope.py):
fused_rope_forward / fused_rope_backward and fused_qkv_rope_forward / fused_qkv_rope_backward, as
common/fused_rope/fused_rope.cu and csrc/extensions/apply_rope.cpp compute them, main d0067d0 (the same arguments
from TE 2.14 on).

Positions: the token at index s_id of sequence b reads frequency row p = s_id + start_positions[b] (0 without them).
Under context parallelism (cp_size > 1) a rank's local sequence of even length L holds two chunks of the full one,
and p adds rank L/2 in the first half, L cp - (rank + 1) L/2 - L/2 in the second (dual-chunk order). The QKV forward
adds start_positions only when cp_size is 1, and its backward never (FusedQKVRoPEFunc does not hand them to it).
thd: tokens packed, sequence b is rows cu_seqlens[b] / cp .. cu_seqlens[b + 1] / cp; rows no sequence covers stay
as at::empty leaves them (uninitialised).

Rotation: the first d2 hidden dims (d2 = freqs' last dim) rotate with sin and cos of the fp32 frequency row
(sincosf): out[j] = x[j] cos[j] + sign x[partner] sin[j] in fp32, partner j + d2/2 (sign -1) in the first half and
j - d2/2 (+1) in the second, or, interleaved, the pair's neighbour j + 1 (-1) / j - 1 (+1); cast once to the input
dtype. Dims past d2 are copied. The backward is the transpose: g[j] cos[j] - sign g[partner] sin[partner]. The QKV
forms split the last dim of one contiguous [s, b, h, q + k + v] tensor: q's and k's d-wide chunks (d = the v split)
rotate with q_freqs and k_freqs, v is copied; q comes back as [s, b, h q / k, k]. Outputs are contiguous whatever the
input's strides, as the kernels write them.

Exactness: torch's fp32 sin and cos are not CUDA's sincosf (each within an fp32 ulp or two of the exact value), and
nvcc may contract the rotation's multiply-add into an FMA where torch rounds each product: fp32 outputs within a few
fp32 ulps of the kernel's; BF16/FP16 outputs equal to its, but where the fp32 value lies within those ulps of a
rounding boundary of the dtype. Copied dims and v are bitwise.

Raised as the kernels' checks: apply_rope.cpp's TORCH_CHECKs and the dtype switch; the kernels' device assert (an odd
local sequence under context parallelism); a frequency row past freqs' rows, a start_positions shorter than the
batch, cu_seqlens past the input's rows (the kernels would read or write out of bounds: no check, undefined).
Refused (strict): an odd rotary dim, non-contiguous freqs, start_positions / cu_seqlens not int32 (the kernels read
int32 words), decreasing cu_seqlens, formats other than sbhd / bshd / thd (the QKV forms: sbhd / bshd), QKV splits
the kernels do not tile (q or k not a multiple of d, d2 > d, k_freqs' dim not q_freqs', splits not the input's).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from te_verify.te.tecpu.strict import refuse

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMATS = {"NVTE_SBHD": "sbhd", "NVTE_BSHD": "bshd", "NVTE_THD": "thd"}


def _format(qkv_format: Any, allowed: tuple[str, ...], what: str) -> str:
    import transformer_engine_torch as tex  # the emulated module: its enum carries the version's values
    name = tex.NVTE_QKV_Format(int(qkv_format)).name
    if FORMATS.get(name) not in allowed:
        refuse(f"tex.{what} with qkv_format {name}")
    return FORMATS[name]


def _check_freqs(freqs: torch.Tensor, what: str) -> None:
    if freqs.dim() != 4:
        raise RuntimeError("expected 4D tensor")
    if freqs.size(1) != 1 or freqs.size(2) != 1:
        raise RuntimeError("expected the second and third dims of the freqs tensor equal 1")
    if freqs.dtype != torch.float32:
        raise RuntimeError("Dtype of the freqs tensor must be float")
    if not freqs.is_contiguous():
        refuse(f"tex.{what} with non-contiguous freqs (the kernel reads freqs as contiguous rows)")
    if freqs.size(3) % 2:
        refuse(f"tex.{what} with an odd rotary dim ({freqs.size(3)}; the kernels rotate pairs of dims)")


def _check_dtype(t: torch.Tensor) -> None:
    if t.dtype not in DTYPES:
        raise RuntimeError(f"Unsupported input dtype {t.dtype}. Expected one of: Float32, Float16, BFloat16.")


def _int32(t: torch.Tensor | None, name: str, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    if t.dim() != 1:
        raise RuntimeError("expected 1D tensor")
    if t.dtype != torch.int32:
        refuse(f"tex.{what} with {name} of {t.dtype} (the kernel reads int32 words)")
    return t.long()


def _starts(start_positions: torch.Tensor | None, batch: int) -> torch.Tensor:
    """start_positions[b] per sequence (0 without them)."""
    if start_positions is None:
        return torch.zeros(batch, dtype=torch.long)
    if start_positions.numel() < batch:
        raise RuntimeError(f"start_positions has {start_positions.numel()} entries for {batch} sequences: the kernel "
                           f"would read past it")
    return start_positions[:batch]


def _cp_offset(s_id: torch.Tensor, length: torch.Tensor | int, cp_size: int, cp_rank: int) -> torch.Tensor | int:
    """The dual-chunk order's row offset of local index s_id in a local sequence of `length` tokens."""
    if cp_size < 1:
        raise RuntimeError(f"cp_size must be at least 1, got {cp_size}")
    if cp_size == 1:
        return 0
    length = torch.as_tensor(length)
    if bool((length % 2 != 0).any()):
        raise RuntimeError("Assertion `cur_seqlens % 2 == 0` failed: a local sequence of odd length under context "
                           "parallelism (the kernel's device assert)")
    first = cp_rank * length // 2
    second = length * cp_size - (cp_rank + 1) * length // 2 - length // 2
    return torch.where(s_id < length // 2, first, second)


def _sin_cos(freqs: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sin and cos of the fp32 frequency rows `rows` (any shape), each [*rows.shape, d2]."""
    table = freqs.reshape(freqs.size(0), freqs.size(3))
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= table.size(0)):
        bad = int(rows.max()) if int(rows.max()) >= table.size(0) else int(rows.min())
        raise RuntimeError(f"frequency row {bad} is outside freqs' {table.size(0)} rows: the kernel would read "
                           f"past freqs")
    f = table[rows]
    return torch.sin(f), torch.cos(f)


def _partners(v: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Each rotated dim's partner along the last dim: the other half (dim j with j + d2/2), or the other of its pair
    (2i with 2i+1); a copy by views, not a gather (the gather was a quarter of a large RoPE test item)."""
    if interleaved:
        return v.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    half = v.shape[-1] // 2
    return torch.cat((v[..., half:], v[..., :half]), dim=-1)


def _signs(d2: int, interleaved: bool) -> torch.Tensor:
    """The forward's sign on each dim's partner: -1 on the first of each pair (or the first half)."""
    j = torch.arange(d2)
    first = (j % 2 == 0) if interleaved else (j < d2 // 2)
    return torch.where(first, -1.0, 1.0)


def rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, interleaved: bool, backward: bool) -> torch.Tensor:
    """The kernels' fp32 rotation of x's first d2 dims (sin, cos broadcast to [..., d2]); the rest copied."""
    d2 = sin.shape[-1]
    sign = _signs(d2, interleaved)
    head = x[..., :d2]
    if backward:
        rotated = head * cos + (-sign * _partners(head, interleaved)) * _partners(sin, interleaved)
    else:
        rotated = head * cos + (sign * _partners(head, interleaved)) * sin
    if d2 == x.shape[-1]:  # row-major, as the concatenation below is (elementwise ops keep a permuted x's layout)
        return rotated.contiguous()
    return torch.cat((rotated, x[..., d2:]), dim=-1)


def _dense_rows(s: int, batch: int, starts: torch.Tensor | None, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Frequency rows [s, batch] of sbhd/bshd tokens."""
    s_id = torch.arange(s).reshape(s, 1)
    rows = s_id + (starts.reshape(1, batch) if starts is not None else 0)
    return rows + _cp_offset(s_id, s, cp_size, cp_rank)


def _thd_rows(tokens: int, cu_seqlens: torch.Tensor, starts: torch.Tensor | None, cp_size: int, cp_rank: int,
              freq_rows: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tokens sequences cover, their frequency rows) of a packed thd input of `tokens` rows."""
    if cp_size < 1:
        raise RuntimeError(f"cp_size must be at least 1, got {cp_size}")
    bounds = torch.div(cu_seqlens, cp_size, rounding_mode="trunc")
    if bool((bounds[1:] < bounds[:-1]).any()):
        refuse(f"tex.{what} with decreasing cu_seqlens")
    if int(bounds[-1]) > tokens:
        raise RuntimeError(f"cu_seqlens reach token {int(bounds[-1])} of an input of {tokens} rows: the kernel "
                           f"would read and write past it")
    covered = torch.arange(int(bounds[0]), int(bounds[-1]))
    seq = torch.searchsorted(bounds[:-1], covered, right=True) - 1
    s_id = covered - bounds[seq]
    if s_id.numel() and int(s_id.max()) >= freq_rows:
        raise RuntimeError(f"a sequence of more than freqs' {freq_rows} rows: the kernel leaves its later tokens "
                           f"unwritten or reads past freqs")
    lengths = (bounds[1:] - bounds[:-1])[seq]
    rows = s_id + (_starts(starts, bounds.numel() - 1)[seq] if starts is not None else 0)
    return covered, rows + _cp_offset(s_id, lengths, cp_size, cp_rank)


def _fused_rope(t: torch.Tensor, freqs: torch.Tensor, start_positions: torch.Tensor | None, qkv_format: Any,
                interleaved: bool, cu_seqlens: torch.Tensor | None, cp_size: int, cp_rank: int,
                backward: bool) -> torch.Tensor:
    what = "fused_rope_backward" if backward else "fused_rope_forward"
    name = "output_grads" if backward else "input"
    _check_freqs(freqs, what)
    starts = _int32(start_positions, "start_positions", what)
    fmt = _format(qkv_format, ("sbhd", "bshd", "thd"), what)
    d2 = freqs.size(3)
    if fmt == "thd":
        if t.dim() != 3:
            raise RuntimeError("expected 3D tensor")
        if cu_seqlens is None:
            raise RuntimeError("expected cu_seqlens tensor")
        cu = _int32(cu_seqlens, "cu_seqlens", what)
        if t.size(2) < d2:
            raise RuntimeError(f"expected the last dim of the {name} tensor equals or is greater than the freqs tensor")
        _check_dtype(t)
        covered, rows = _thd_rows(t.size(0), cu, starts, cp_size, cp_rank, freqs.size(0), what)
        sin, cos = _sin_cos(freqs, rows.reshape(-1, 1))
        out = torch.empty(t.shape, dtype=t.dtype)
        out[covered] = rotate(t[covered].float(), sin, cos, interleaved, backward).to(t.dtype)
        return out
    if t.dim() != 4:
        raise RuntimeError("expected 4D tensor")
    s, batch = (t.size(0), t.size(1)) if fmt == "sbhd" else (t.size(1), t.size(0))
    if s * cp_size > freqs.size(0):
        raise RuntimeError(f"expected freqs tensor has a longer sequence length than {name}")
    if t.size(3) < d2:
        raise RuntimeError(f"expected the last dim of the {name} tensor equals or is greater than the freqs tensor")
    _check_dtype(t)
    rows = _dense_rows(s, batch, _starts(starts, batch) if starts is not None else None, cp_size, cp_rank)
    sin, cos = _sin_cos(freqs, rows if fmt == "sbhd" else rows.t())
    out = rotate(t.float(), sin.unsqueeze(2), cos.unsqueeze(2), interleaved, backward).to(t.dtype)
    return out.contiguous()


def fused_rope_forward(input: torch.Tensor, freqs: torch.Tensor, start_positions: torch.Tensor | None,
                       qkv_format: Any, interleaved: bool, cu_seqlens: torch.Tensor | None, cp_size: int,
                       cp_rank: int) -> torch.Tensor:
    """tex.fused_rope_forward: `input` (sbhd/bshd [s, b, h, d] / [b, s, h, d], thd [t, h, d]) rotated."""
    return _fused_rope(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank, False)


def fused_rope_backward(output_grads: torch.Tensor, freqs: torch.Tensor, start_positions: torch.Tensor | None,
                        qkv_format: Any, interleaved: bool, cu_seqlens: torch.Tensor | None, cp_size: int,
                        cp_rank: int) -> torch.Tensor:
    """tex.fused_rope_backward: the forward's transpose rotation of `output_grads`."""
    return _fused_rope(output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank,
                       True)


def _qkv_split(split: Sequence[int], d2: int, k_freqs: torch.Tensor, total: int, heads: int,
               what: str) -> tuple[int, int, int]:
    if len(split) != 3:
        refuse(f"tex.{what} with {len(split)} splits (the kernels read three: q, k, v)")
    q, k, v = (int(x) for x in split)
    if q + k + v != total or v <= 0 or k <= 0 or q % v or k % v or d2 > v or k_freqs.size(3) != d2 or (heads * q) % k:
        refuse(f"tex.{what} with splits {[q, k, v]} of a {total}-wide input, {heads} heads and rotary dims "
               f"{d2} / {k_freqs.size(3)} (the kernels tile q and k by d = the v split, d2 <= d, one rotary dim)")
    return q, k, v


def _qkv_rows(s: int, batch: int, fmt: str, starts: torch.Tensor | None, cp_size: int,
              cp_rank: int) -> torch.Tensor:
    """Frequency rows of the QKV kernels, shaped as the tensor's two leading dims: start_positions only without cp."""
    rows = _dense_rows(s, batch, starts if cp_size == 1 else None, cp_size, cp_rank)
    return rows if fmt == "sbhd" else rows.t()


def _rotate_chunks(x: torch.Tensor, freqs: torch.Tensor, rows: torch.Tensor, d: int, interleaved: bool,
                   backward: bool) -> torch.Tensor:
    """x [s0, s1, h, n d] rotated chunk by chunk (each d wide) with the frequency rows [s0, s1]."""
    sin, cos = _sin_cos(freqs, rows)
    chunks = x.reshape(*x.shape[:3], -1, d)
    out = rotate(chunks, sin[:, :, None, None], cos[:, :, None, None], interleaved, backward)
    return out.reshape(x.shape)


def fused_qkv_rope_forward(qkv_input: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor,
                           start_positions: torch.Tensor | None, qkv_split_arg_list: Sequence[int], qkv_format: Any,
                           interleaved: bool, cp_size: int, cp_rank: int) -> tuple[torch.Tensor, ...]:
    """tex.fused_qkv_rope_forward -> (q [.., h q / k, k], k [.., h, k], v [.., h, v])."""
    what = "fused_qkv_rope_forward"
    _check_freqs(q_freqs, what)
    _check_freqs(k_freqs, what)
    starts = _int32(start_positions, "start_positions", what)
    fmt = _format(qkv_format, ("sbhd", "bshd"), what)
    if qkv_input.dim() != 4:
        raise RuntimeError("expected 4D input tensor")
    if not qkv_input.is_contiguous():
        raise RuntimeError("input tensor must be contiguous")
    _check_dtype(qkv_input)
    s0, s1, h, total = qkv_input.shape
    q, k, v = _qkv_split(qkv_split_arg_list, q_freqs.size(3), k_freqs, total, h, what)
    s, batch = (s0, s1) if fmt == "sbhd" else (s1, s0)
    rows = _qkv_rows(s, batch, fmt, _starts(starts, batch) if starts is not None else None, cp_size, cp_rank)
    x = qkv_input.float()
    q_out = _rotate_chunks(x[..., :q], q_freqs, rows, v, interleaved, False).to(qkv_input.dtype)
    k_out = _rotate_chunks(x[..., q:q + k], k_freqs, rows, v, interleaved, False).to(qkv_input.dtype)
    v_out = qkv_input[..., q + k:].contiguous()
    return q_out.reshape(s0, s1, h * q // k, k), k_out.contiguous(), v_out


def fused_qkv_rope_backward(q_grad_out: torch.Tensor, k_grad_out: torch.Tensor, v_grad_out: torch.Tensor,
                            q_freqs: torch.Tensor, k_freqs: torch.Tensor, qkv_split_arg_list: Sequence[int],
                            qkv_format: Any, interleaved: bool, cp_size: int, cp_rank: int) -> torch.Tensor:
    """tex.fused_qkv_rope_backward -> the [s, b, h, q + k + v] gradient of the forward's input."""
    what = "fused_qkv_rope_backward"
    fmt = _format(qkv_format, ("sbhd", "bshd"), what)
    grads = (q_grad_out, k_grad_out, v_grad_out)
    _check_dtype(q_grad_out)
    if any(g.dim() != 4 or not g.is_contiguous() or g.dtype != q_grad_out.dtype for g in grads):
        refuse(f"tex.{what} with gradients not all contiguous 4D {q_grad_out.dtype} (the kernel reads them so)")
    total = sum(int(x) for x in qkv_split_arg_list)
    total_hd = sum(g.size(2) for g in grads) * q_grad_out.size(3)
    if total <= 0 or total_hd % total:
        refuse(f"tex.{what} with gradients of {total_hd} head dims for splits {list(qkv_split_arg_list)}")
    s0, s1, h = q_grad_out.size(0), q_grad_out.size(1), total_hd // total
    q, k, v = _qkv_split(qkv_split_arg_list, q_freqs.size(3), k_freqs, total, h, what)
    for g, width in zip(grads, (q, k, v)):
        if g.size(0) != s0 or g.size(1) != s1 or g.numel() != s0 * s1 * h * width:
            refuse(f"tex.{what} with gradients {[list(g.shape) for g in grads]} for splits {[q, k, v]}, {h} heads")
    s, batch = (s0, s1) if fmt == "sbhd" else (s1, s0)
    rows = _qkv_rows(s, batch, fmt, None, cp_size, cp_rank)
    gq = _rotate_chunks(q_grad_out.float().reshape(s0, s1, h, q), q_freqs, rows, v, interleaved, True)
    gk = _rotate_chunks(k_grad_out.float().reshape(s0, s1, h, k), k_freqs, rows, v, interleaved, True)
    gv = v_grad_out.float().reshape(s0, s1, h, v)
    return torch.cat((gq, gk, gv), dim=-1).to(q_grad_out.dtype)


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    names = ("fused_rope_forward", "fused_rope_backward", "fused_qkv_rope_forward", "fused_qkv_rope_backward")
    return {name: globals()[name] for name in names}
