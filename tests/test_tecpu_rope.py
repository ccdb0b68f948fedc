"""TE's fused rotary position embedding (te_verify/te/tecpu/rope.py) held to the definition of RoPE
(arXiv 2104.09864, as common/fused_rope/fused_rope.cu applies it), written here in float64:
- forward: each pair of the first d2 hidden dims (j, j + d2/2, or 2j, 2j + 1 when interleaved) rotated by the angles
  of its token's frequency row, x_a cos(t_a) - x_b sin(t_a) and x_b cos(t_b) + x_a sin(t_b); the dims past d2
  copied bitwise; each output within one unit in the last place of its dtype (plus a few fp32 ulps of the pair's
  magnitude: the kernel's sincosf and fp32 arithmetic) of the fp64 value;
- backward: the transpose of that linear map (autograd's vector-Jacobian product of the fp64 definition);
- the rows: a token's index in its sequence plus start_positions[b]; under context parallelism a rank's two chunks of
  the full sequence (rank r of cp holds chunks r and 2 cp - 1 - r); thd sequences from cu_seqlens / cp;
- the QKV forms: q's and k's head-dim chunks rotated with their own tables, v copied; their backward reads the rows
  without start_positions (FusedQKVRoPEFunc does not pass them);
- apply_rope.cpp's checks and the refused forms; TE's apply_rotary_pos_emb(fused=True) agrees with its unfused torch
  path (fused=False) within the dtype's rounding, forward and backward."""
from __future__ import annotations

import re
import types

import pytest
import torch

from te_verify.te import tecpu

F32_EPS = 2.0 ** -23
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
FORMATS = ["sbhd", "bshd", "thd"]
S, B, H, D = 10, 3, 2, 32  # sbhd / bshd: [S, B, H, D]
CU = [0, 5, 12, 12, 20]  # thd: four sequences (one empty) packed in 20 tokens
ROWS = 64  # frequency rows


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.attention import rope
    from transformer_engine.pytorch.cpp_extensions.fused_attn import QKVFormat

    return types.SimpleNamespace(te=te_pytorch, tex=tex, rope=rope, fmt=QKVFormat)


def rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def angles(rows: int, d2: int, seed: int) -> torch.Tensor:
    """A frequency table [rows, 1, 1, d2] of arbitrary angles (its halves differ, unlike TE's embedding's)."""
    return (torch.rand(rows, 1, 1, d2, generator=torch.Generator().manual_seed(seed)) * 200 - 100).contiguous()


def tensor(fmt: str, dtype: torch.dtype, seed: int, d: int = D, strided: bool = True) -> torch.Tensor:
    shape = {"sbhd": (S, B, H, d), "bshd": (B, S, H, d), "thd": (CU[-1], H, d)}[fmt]
    x = rand(*shape, seed=seed, dtype=dtype)
    # a head-major memory layout (the kernels take any strides; TE's own tests transpose so too)
    return x.transpose(-3, -2).contiguous().transpose(-3, -2) if strided else x


def sequence_rows(length: int, start: int, cp_size: int, rank: int) -> torch.Tensor:
    """The full-sequence positions of a rank's `length` local tokens: its two chunks of the cp-split sequence."""
    if cp_size == 1:
        return torch.arange(length) + start
    half = length // 2
    first, second = rank, 2 * cp_size - 1 - rank
    return torch.cat((torch.arange(first * half, (first + 1) * half),
                      torch.arange(second * half, (second + 1) * half))) + start


def token_rows(fmt: str, starts: list[int] | None = None, cp_size: int = 1, rank: int = 0,
               cu: list[int] = CU) -> torch.Tensor:
    """Each token's frequency row, shaped as the input's leading dims."""
    if fmt == "thd":
        lengths = [(b - a) // cp_size for a, b in zip(cu[:-1], cu[1:])]
        starts = starts or [0] * len(lengths)
        return torch.cat([sequence_rows(n, st, cp_size, rank) for n, st in zip(lengths, starts)])
    starts = starts or [0] * B
    rows = torch.stack([sequence_rows(S, st, cp_size, rank) for st in starts], dim=1)  # [S, B]
    return rows if fmt == "sbhd" else rows.t()


def pairs(d2: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return torch.arange(0, d2, 2), torch.arange(1, d2, 2)
    return torch.arange(d2 // 2), torch.arange(d2 // 2, d2)


def definition(x: torch.Tensor, theta: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """fp64 RoPE of x [..., d] by the angles theta [..., d2] (broadcast over heads): each pair (a, b) rotated."""
    a, b = pairs(theta.shape[-1], interleaved)
    xa, xb = x[..., a], x[..., b]
    y = x.clone()
    y[..., a] = xa * theta[..., a].cos() - xb * theta[..., a].sin()
    y[..., b] = xb * theta[..., b].cos() + xa * theta[..., b].sin()
    return y


def definition_backward(g: torch.Tensor, theta: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The transpose of the forward's linear map applied to g: autograd's vector-Jacobian product in fp64."""
    x = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
    return torch.autograd.grad(definition(x, theta, interleaved), x, g.double())[0]


def pair_scale(x: torch.Tensor, d2: int, interleaved: bool) -> torch.Tensor:
    """|x_a| + |x_b| at both dims of each pair (0 past d2)."""
    a, b = pairs(d2, interleaved)
    scale = torch.zeros(x.shape, dtype=torch.float64)
    both = x[..., a].double().abs() + x[..., b].double().abs()
    scale[..., a], scale[..., b] = both, both
    return scale


def theta_of(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The angles [*rows.shape, 1, d2] (fp32 values, exact in fp64) of the rows, broadcast over heads."""
    return table.reshape(table.shape[0], -1)[rows].double().unsqueeze(-2)


def assert_rotation(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, d2: int, source: torch.Tensor,
                    what: str) -> None:
    """Rotated dims within one ulp of got's dtype of the fp64 value plus 4 fp32 ulps of the pair's magnitude; the
    dims past d2 the source's, bitwise."""
    assert got.dtype == source.dtype and got.shape == source.shape and got.is_contiguous(), \
        f"{what}: {got.dtype} {list(got.shape)} contiguous={got.is_contiguous()}"
    finfo = torch.finfo(got.dtype)
    bound = finfo.eps * want.abs() + 4 * F32_EPS * scale + finfo.tiny
    err = (got.double() - want).abs()
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), (f"{what}: element {worst} is {got.reshape(-1)[worst].item()!r}, the fp64 "
                                        f"definition {want.reshape(-1)[worst].item()!r} (beyond one ulp)")
    assert torch.equal(got[..., d2:], source[..., d2:]), f"{what}: the dims past {d2} are not copied"


def fused(te, fn: str, x: torch.Tensor, table: torch.Tensor, fmt: str, interleaved: bool,
          starts: list[int] | None = None, cp_size: int = 1, rank: int = 0, cu: list[int] = CU) -> torch.Tensor:
    sp = torch.tensor(starts, dtype=torch.int32) if starts is not None else None
    cu_seqlens = torch.tensor(cu, dtype=torch.int32) if fmt == "thd" else None
    return getattr(te.tex, fn)(x, table, sp, te.fmt[fmt], interleaved, cu_seqlens, cp_size, rank)


def check_both_ways(te, x: torch.Tensor, table: torch.Tensor, fmt: str, interleaved: bool, rows: torch.Tensor,
                    what: str, **kw) -> None:
    d2, theta = table.shape[-1], theta_of(table, rows)
    got = fused(te, "fused_rope_forward", x, table, fmt, interleaved, **kw)
    assert_rotation(got, definition(x.double(), theta, interleaved), pair_scale(x, d2, interleaved), d2, x,
                    f"{what} forward")
    g = rand(*x.shape, seed=99, dtype=x.dtype)
    got = fused(te, "fused_rope_backward", g, table, fmt, interleaved, **kw)
    assert_rotation(got, definition_backward(g, theta, interleaved), pair_scale(g, d2, interleaved), d2, g,
                    f"{what} backward")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("d2", [D, 12], ids=["full", "partial"])
def test_forward_is_the_rotation_and_backward_its_transpose(te, dtype, fmt, interleaved, d2):
    x = tensor(fmt, dtype, seed=1)
    check_both_ways(te, x, angles(ROWS, d2, seed=2), fmt, interleaved, token_rows(fmt), f"{fmt} {dtype}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_start_positions_offset_each_sequences_rows(te, fmt):
    starts = [7, 0, 3, 11] if fmt == "thd" else [7, 0, 3]
    x = tensor(fmt, torch.bfloat16, seed=3)
    check_both_ways(te, x, angles(ROWS, 16, seed=4), fmt, True, token_rows(fmt, starts), f"{fmt} start_positions",
                    starts=starts)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_context_parallel_rank_reads_its_two_chunks_of_the_sequence(te, fmt, rank):
    cu = [0, 8, 8, 20, 24]  # every sequence a multiple of 2 cp
    starts = [2, 5, 1, 4] if fmt == "thd" else [2, 5, 1]
    x = rand(cu[-1] // 2, H, D, seed=5) if fmt == "thd" else tensor(fmt, torch.float32, seed=5)
    rows = token_rows(fmt, starts, cp_size=2, rank=rank, cu=cu)
    check_both_ways(te, x, angles(ROWS, D, seed=6), fmt, False, rows, f"{fmt} cp rank {rank}", starts=starts,
                    cp_size=2, rank=rank, cu=cu)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_te_fused_rope_agrees_with_tes_unfused_path(te, dtype, fmt, interleaved):
    """apply_rotary_pos_emb(fused=True) over the emulation against fused=False (TE's torch ops on the fp32 input,
    cast, as TE's own test compares them), forward and backward, with TE's embedding and start positions."""
    emb = te.rope.RotaryPositionEmbedding(D, rotary_percent=0.5, interleaved=interleaved)(ROWS)
    starts = torch.tensor([4, 0, 9], dtype=torch.int32)
    # no empty sequence: TE's unfused interleaved path cannot view one
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32) if fmt == "thd" else None
    x = tensor(fmt, dtype, seed=7).requires_grad_()
    g = rand(*x.shape, seed=8, dtype=dtype)
    outputs = {}
    for is_fused in (True, False):
        source = x if is_fused else x.float()
        y = te.rope.apply_rotary_pos_emb(source, emb, tensor_format=fmt, start_positions=starts,
                                         interleaved=interleaved, fused=is_fused, cu_seqlens=cu).to(dtype)
        (grad,) = torch.autograd.grad(y, x, g)
        outputs[is_fused] = y.detach(), grad
    for (got, want), what in zip(zip(outputs[True], outputs[False]), ("forward", "backward")):
        bound = torch.finfo(dtype).eps * want.double().abs() + 4 * F32_EPS * x.detach().double().abs().amax()
        assert bool(((got.double() - want.double()).abs() <= bound).all()), f"{what}: fused and unfused differ"


def qkv_tables(d2: int) -> tuple[torch.Tensor, torch.Tensor]:
    return angles(2 * S, d2, seed=10), angles(2 * S, d2, seed=11)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("cp_size", [1, 2], ids=["cp1", "cp2-rank1"])
def test_qkv_forms_rotate_q_and_k_chunks_with_their_tables_and_copy_v(te, dtype, fmt, interleaved, cp_size):
    d, d2 = 16, 8
    split = [4 * d, d, d]  # four q heads per k/v head
    q_table, k_table = qkv_tables(d2)
    rank = cp_size - 1
    starts = [3, 0, 6] if cp_size == 1 else None  # the forward's start_positions: without cp only
    qkv = rand(*((S, B) if fmt == "sbhd" else (B, S)), H, sum(split), seed=12, dtype=dtype)
    sp = torch.tensor(starts, dtype=torch.int32) if starts else None
    q, k, v = te.tex.fused_qkv_rope_forward(qkv, q_table, k_table, sp, split, te.fmt[fmt], interleaved, cp_size, rank)
    lead = qkv.shape[:2]
    x_q = qkv[..., :split[0]].reshape(*lead, H * 4, d)
    x_k = qkv[..., split[0]:split[0] + d]
    rows = token_rows(fmt, starts, cp_size, rank)
    for got, x, table, what in ((q, x_q, q_table, "q"), (k, x_k, k_table, "k")):
        want = definition(x.double(), theta_of(table, rows), interleaved)
        assert_rotation(got, want, pair_scale(x, d2, interleaved), d2, x, f"qkv forward {what}")
    assert torch.equal(v, qkv[..., split[0] + d:]), "v is not copied"
    grads = [rand(*t.shape, seed=13 + i, dtype=dtype) for i, t in enumerate((q, k, v))]
    got = te.tex.fused_qkv_rope_backward(*grads, q_table, k_table, split, te.fmt[fmt], interleaved, cp_size, rank)
    rows = token_rows(fmt, None, cp_size, rank)  # the backward kernel reads no start_positions
    want_q = definition_backward(grads[0], theta_of(q_table, rows), interleaved).reshape(*lead, H, split[0])
    want_k = definition_backward(grads[1], theta_of(k_table, rows), interleaved)
    want = torch.cat((want_q, want_k, grads[2].double()), dim=-1)
    scale = torch.cat((pair_scale(grads[0], d2, interleaved).reshape(*lead, H, split[0]),
                       pair_scale(grads[1], d2, interleaved), torch.zeros(grads[2].shape, dtype=torch.float64)), -1)
    assert_rotation(got, want, scale, 0, got, "qkv backward")
    assert torch.equal(got[..., split[0] + d:], grads[2]), "v's gradient is not copied"


def _call(fn: str, *args):
    return lambda te: getattr(te.tex, fn)(*args[:3], te.fmt[args[3]], *args[4:])


X4, T3, F8 = torch.zeros(4, 1, 1, 8), torch.zeros(6, 1, 8), torch.zeros(8, 1, 1, 8)
CU2 = torch.tensor([0, 6], dtype=torch.int32)


@pytest.mark.parametrize("call,error,message", [
    (_call("fused_rope_forward", X4, torch.zeros(8, 8), None, "sbhd", False, None, 1, 0), RuntimeError,
     "expected 4D tensor"),
    (_call("fused_rope_forward", X4, F8.half(), None, "sbhd", False, None, 1, 0), RuntimeError, "must be float"),
    (_call("fused_rope_forward", X4, F8[:3], None, "sbhd", False, None, 1, 0), RuntimeError,
     "longer sequence length"),
    (_call("fused_rope_forward", torch.zeros(4, 1, 1, 4), F8, None, "sbhd", False, None, 1, 0), RuntimeError,
     "equals or is greater"),
    (_call("fused_rope_backward", T3, F8, None, "thd", False, None, 1, 0), RuntimeError, "expected cu_seqlens"),
    (_call("fused_rope_forward", X4.double(), F8, None, "sbhd", False, None, 1, 0), RuntimeError,
     "Unsupported input dtype"),
    (_call("fused_rope_forward", torch.zeros(3, 1, 1, 8), F8, None, "sbhd", False, None, 2, 0), RuntimeError,
     "cur_seqlens % 2"),
    (_call("fused_rope_forward", X4, F8, torch.tensor([6], dtype=torch.int32), "sbhd", False, None, 1, 0),
     RuntimeError, "outside freqs' 8 rows"),
    (_call("fused_rope_forward", X4, F8, torch.tensor([1]), "sbhd", False, None, 1, 0), tecpu.Unemulated,
     "start_positions of torch.int64"),
    (_call("fused_rope_forward", T3, F8, None, "thd", False, CU2.long(), 1, 0), tecpu.Unemulated,
     "cu_seqlens of torch.int64"),
    (_call("fused_rope_forward", T3, F8, None, "thd", False, torch.tensor([0, 4, 2, 6], dtype=torch.int32), 1, 0),
     tecpu.Unemulated, "decreasing cu_seqlens"),
    (_call("fused_rope_forward", X4, torch.zeros(8, 1, 1, 7), None, "sbhd", False, None, 1, 0), tecpu.Unemulated,
     "odd rotary dim"),
    (lambda te: te.tex.fused_qkv_rope_forward(torch.zeros(4, 1, 1, 24), F8, F8, None, [8, 8, 8], te.fmt["thd"],
                                              False, 1, 0), tecpu.Unemulated, "qkv_format NVTE_THD"),
    (lambda te: te.tex.fused_qkv_rope_forward(torch.zeros(4, 1, 1, 20), F8, F8, None, [12, 4, 4], te.fmt["sbhd"],
                                              False, 1, 0), tecpu.Unemulated, "splits"),
], ids=["freqs-3d", "freqs-fp16", "freqs-short", "d<d2", "thd-no-cu", "fp64", "cp-odd", "row-past", "start-int64",
        "cu-int64", "cu-decreasing", "odd-d2", "qkv-thd", "qkv-split"])
def test_apply_rope_cpp_checks_and_refused_forms(te, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(te)
