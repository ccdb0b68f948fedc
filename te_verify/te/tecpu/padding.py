"""tex's row padding of grouped-GEMM inputs (`Fp8Padding` / `Fp8Unpadding`), as TE defines it.

csrc/extensions/padding.cpp and common/util/padding.cu (main d0067d0): the 2-D input is read as consecutive splits
of `input_rows[i]` rows; `fused_multi_row_padding` writes split i to `padded_rows[i]` rows of the output (its rows,
then zeros), `fused_multi_row_unpadding` the first `unpadded_rows[i]` rows of each padded split. A split with no
input rows is skipped by the C++ (its output rows keep what was there), which is kept here; every NVTE_CHECK of
the C++ is checked here with its message.
"""
from __future__ import annotations

import torch

from te_verify.te.tecpu.strict import refuse
from te_verify.te.tecpu.writes import write


def _check(input: torch.Tensor, output: torch.Tensor, rows: list[int], out_rows: list[int], what: str) -> None:
    if len(rows) != len(out_rows):
        raise RuntimeError("Number of input row list and padded row list must match.")
    if input.dim() != 2 or output.dim() != 2:
        raise RuntimeError(f"{what}: input and output must have 2 dimensions, got {input.dim()} and {output.dim()}")
    if input.dtype != output.dtype:
        raise RuntimeError(f"{what}: Output tensor types do not match.")
    if input.shape[1] != output.shape[1]:
        # The C++ addresses the output with input's row length per split: a differing width has no defined layout.
        refuse(f"transformer_engine_torch.{what} from width {input.shape[1]} to {output.shape[1]}")


def _refuse_shrinking(rows: list[int], padded: list[int], what: str) -> None:
    """A padded split shorter than its unpadded one has the kernels reading or writing into the next split (their
    tiles are sized by one count, bounded by the other): not a padding, not emulated."""
    short = [(n, p) for n, p in zip(rows, padded) if n and p < n]
    if short:
        refuse(f"transformer_engine_torch.{what} with (rows, padded rows) {short}")


def _copy_splits(input: torch.Tensor, output: torch.Tensor, in_rows: list[int], out_rows: list[int],
                 copied: list[int], zero_tail: bool) -> None:
    """Split i: in_rows[i] input rows at its offset, out_rows[i] output rows at its; copies copied[i] rows and, with
    zero_tail, zeros the output rows after them. Offsets advance over skipped (empty) splits too, as the C++ does."""
    in_at = out_at = 0
    for n_in, n_out, n_copy in zip(in_rows, out_rows, copied):
        if n_in:
            write(output[out_at:out_at + n_copy], input[in_at:in_at + n_copy])
            if zero_tail:
                write(output[out_at + n_copy:out_at + n_out], 0)
        in_at += n_in
        out_at += n_out
    if in_at > input.shape[0] or out_at > output.shape[0]:
        raise RuntimeError(f"splits cover {in_at} input / {out_at} output rows; the tensors hold "
                           f"{input.shape[0]} / {output.shape[0]}")


def fused_multi_row_padding(input: torch.Tensor, output: torch.Tensor, input_row_list: list[int],
                            padded_input_row_list: list[int]) -> None:
    """output = each split's rows followed by zeros up to its padded row count."""
    _check(input, output, input_row_list, padded_input_row_list, "fused_multi_row_padding")
    _refuse_shrinking(input_row_list, padded_input_row_list, "fused_multi_row_padding")
    _copy_splits(input, output, input_row_list, padded_input_row_list, input_row_list, zero_tail=True)


def fused_multi_row_unpadding(input: torch.Tensor, output: torch.Tensor, input_row_list: list[int],
                              unpadded_input_row_list: list[int]) -> None:
    """output = the first unpadded rows of each (padded) input split."""
    _check(input, output, input_row_list, unpadded_input_row_list, "fused_multi_row_unpadding")
    _refuse_shrinking(unpadded_input_row_list, input_row_list, "fused_multi_row_unpadding")
    _copy_splits(input, output, input_row_list, unpadded_input_row_list, unpadded_input_row_list, zero_tail=False)
