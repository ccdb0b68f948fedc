"""How TE's context-parallel THD kernels (common/fused_attn/context_parallel.cu) address packed sequences, shared by
the corrections (thd_context_parallel.py) and the partitions (thd_partition.py): the binding's checks, the
boundaries as int32 words divided with C's truncation, the kernels' binary search from token to sequence, and the
strict guards (reads or writes past a tensor's memory, a place two tokens write, an empty launch grid)."""
from __future__ import annotations

import math

import torch

from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import memory, write

FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # TRANSFORMER_ENGINE_TYPE_SWITCH_NON_FP8ONLY
TE_DTYPES = FLOATS + (torch.uint8, torch.bool, torch.int16, torch.int32, torch.int64, torch.float8_e4m3fn,
                      torch.float8_e5m2)  # GetTransformerEngineDType's
VECTOR = 16  # bytes of the kernels' float4 loads and stores


def check(ok: bool, expr: str) -> None:
    if not ok:
        raise RuntimeError(f"Assertion failed: {expr}. ")


def switch(x: torch.Tensor) -> None:
    if x.dtype not in FLOATS:
        raise RuntimeError(f"Unsupported dtype {x.dtype}. Expected one of: Float32, Float16, BFloat16.")


def check_cu(cu: torch.Tensor, at_least: int = 0, name: str = "cu_seqlens") -> None:
    check(cu.dtype == torch.int32, f"{name}.scalar_type() == at::ScalarType::Int")
    check(cu.dim() == 1 and cu.size(0) >= at_least, f"{name}.dim() == 1 && {name}.size(0) >= {at_least}")


def row_bytes(x: torch.Tensor, first: int) -> int:
    """The launchers' check that a token (the elements from dim `first` on) is whole 16-byte vectors; its elements."""
    if x.dtype not in TE_DTYPES:
        raise RuntimeError(f"Invalid type ({x.dtype}).")
    hidden = math.prod(x.shape[first:])
    check(hidden * x.element_size() % VECTOR == 0, "hidden_size_in_bytes % 16 == 0")
    return hidden


def words(cu: torch.Tensor, divisor: int, what: str) -> torch.Tensor:
    """The boundaries as the kernels hold them in shared memory: each int32 word divided with C's truncation."""
    return torch.div(memory(cu, what).to(torch.int64), divisor, rounding_mode="trunc")


def search(bounds: torch.Tensor, what: str, tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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


def within(what: str, *spans: tuple[torch.Tensor, int, str], written: torch.Tensor | None = None,
            grid: tuple[int, ...] = (1,)) -> None:
    """A launch grid with blocks; every index inside its tensor's memory; the places written each written once."""
    if min(grid) <= 0:
        raise RuntimeError(f"{what}: CUDA Error: invalid configuration argument (a launch grid of {grid} blocks)")
    for index, size, noun in spans:
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            refuse(f"{what} addressing {noun} {int(index.min())} .. {int(index.max())} of {size} (past its memory)")
    if written is not None and written.unique().numel() != written.numel():
        refuse(f"{what} writing the same place twice (a race on the GPU)")


def scatter(dst: torch.Tensor, dim: int, index: torch.Tensor, values: torch.Tensor) -> None:
    """dst's entries `index` along dim set to values, in place as the kernels' stores."""
    write(dst, dst.clone().index_copy_(dim, index, values))
