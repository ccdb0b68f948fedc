"""TE's THD partition helpers for context parallelism (TE >= 2.18 for the reorders and copy_valid_tokens):
tex.thd_get_partitioned_indices, thd_sequence_order_to_cp_rank_order, thd_cp_rank_order_to_sequence_order and
thd_copy_valid_tokens_from_per_split_to_rank_local, from common/fused_attn/context_parallel.cu at main d0067d0 and
the bindings of TE 2.20.2's sdist (thd_context_parallel.py's docstring: the definitions and what is refused).
Index and copy functions: bitwise."""
from __future__ import annotations

from typing import Any

import torch

from te_verify.te.tecpu import thd_layout as layout
from te_verify.te.tecpu.device import EMULATED


def _partition_source(tokens: torch.Tensor, rank: Any, bounds: torch.Tensor, world: int, what: str) -> torch.Tensor:
    """thd_partition_src_index: the sequence-order row of rank `rank`'s token (bounds divided by world)."""
    seq = layout.search(bounds, what, tokens)[1]
    start = bounds[seq]
    index, half = tokens - start, torch.div(bounds[seq + 1] - start, 2, rounding_mode="trunc")
    return index + start * world + half * torch.where(index < half, rank, 2 * (world - 1) - rank)


def _check_partition(cu: torch.Tensor, world: int, total: int) -> None:
    layout.check_cu(cu, 2)
    layout.check(world > 0 and total > 0 and total % (world * 2) == 0,
           "world_size > 0 && total_tokens > 0 && total_tokens % (world_size * 2) == 0")


def thd_get_partitioned_indices(cu_seqlens: torch.Tensor, total_tokens: int, world_size: int, rank: int,
                                /) -> torch.Tensor:
    what = "tex.thd_get_partitioned_indices"
    layout.check_cu(cu_seqlens, 2)
    layout.check(0 <= rank < world_size, "rank >= 0 && rank < world_size")
    _check_partition(cu_seqlens, world_size, total_tokens)
    cu = layout.words(cu_seqlens, 1, what)
    if bool((cu % (2 * world_size) != 0).any()):
        raise RuntimeError("CUDA error: device-side assert triggered (thd_partition_indices_kernel: Assertion "
                           "`seqlen % (world_size * 2) == 0` failed)")
    tokens = torch.arange(total_tokens // world_size)
    return _partition_source(tokens, rank, cu // world_size, world_size, what).to(torch.int32)


def _reorder(inp: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int, total_tokens: int, to_sequence: bool,
             what: str) -> torch.Tensor:
    _check_partition(cu_seqlens, cp_size, total_tokens)
    layout.check(inp.dim() >= 1 and inp.size(0) == total_tokens, "inp.dim() >= 1 && inp.size(0) == total_tokens")
    hidden, per_rank, rows = layout.row_bytes(inp, 1), total_tokens // cp_size, torch.arange(total_tokens)
    bounds = layout.words(cu_seqlens, cp_size, what)
    source = _partition_source(rows % per_rank, rows // per_rank, bounds, cp_size, what)
    layout.within(what, (source, total_tokens, "rows"), written=source if to_sequence else None)
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
    layout.check_cu(cu_seqlens, 2)
    layout.check_cu(cu_seqlens_padded, name="cu_seqlens_padded")
    layout.check(cu_seqlens_padded.size(0) == cu_seqlens.size(0), "cu_seqlens_padded.size(0) == cu_seqlens.size(0)")
    layout.check(inp.dim() >= 1 and out.shape == inp.shape and out.dtype == inp.dtype,
                 "out matches inp's sizes and type")
    if not out.is_contiguous():
        raise RuntimeError(f"Assertion failed: out.is_contiguous(). {what[4:]} output must be contiguous.")
    layout.check(inp.size(0) > 0, "total_tokens > 0")
    total, hidden = inp.size(0), layout.row_bytes(inp, 1)
    padded, valid = layout.words(cu_seqlens_padded, 1, what), layout.words(cu_seqlens, 1, what)
    tokens = torch.arange(total)
    seq = layout.search(padded, what, tokens)[1]
    local = tokens - padded[seq]
    rows = tokens[(local >= 0) & (local < valid[seq + 1] - valid[seq])]
    layout.scatter(out.view(total, hidden), 0, rows, inp.contiguous().view(total, hidden)[rows])


def functions() -> dict[str, Any]:
    """The emulated tex functions of this module, by name."""
    return {fn.__name__: fn for fn in (
        thd_get_partitioned_indices, thd_sequence_order_to_cp_rank_order, thd_cp_rank_order_to_sequence_order,
        thd_copy_valid_tokens_from_per_split_to_rank_local)}
