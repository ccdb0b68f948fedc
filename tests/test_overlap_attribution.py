"""A backward GEMM over a cast copy of a slice of a layer's input is that layer's, found by overlapping bytes of the
copy's source (probes.extents): issue 36's split-K build, whose bf16 GroupedLinear wgrad halves read fp32 casts of row
slices of an expert's input while the forward read casts of its column slices (4 wgrad halves unattributed). Twins:
bytes of the same storage that no layer read, and bytes a layer read but that were overwritten since, stay
unattributed."""
from __future__ import annotations

import torch

from te_verify.probes.flops import GemmProbe

IN, ROWS, SPLIT = 8, 5, 1  # an uneven row split: no row slice is also a column slice's exact view


def _split_k_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T as two half-K GEMMs over fp32 casts of column slices of bf16 x and of the weight's fp32 copy."""
    half, w32 = x.shape[1] // 2, w.detach().float().t()
    return x[:, :half].float() @ w32[:half] + x[:, half:].float() @ w32[half:]


def _wgrad_rows(g: torch.Tensor, x: torch.Tensor) -> None:
    """g^T @ x split along the rows, each half over an fp32 cast of a row slice of x."""
    g.t()[:, :SPLIT] @ x[:SPLIT].float()
    g.t()[:, SPLIT:] @ x[SPLIT:].float()


def _backward_gemms(planted) -> list[tuple[str, int | None]]:
    """Two same-shape layers (their shape names neither), layer 0 reading the first ROWS rows of a bf16 buffer: the
    backward GEMMs' (role, layer) after `planted(buffer, layer 0's input, output gradient)`."""
    model = torch.nn.Sequential(torch.nn.Linear(IN, IN, bias=False), torch.nn.Linear(IN, IN, bias=False))
    buffer = torch.randn(2 * ROWS, IN, dtype=torch.bfloat16)
    probe = GemmProbe(follow_copies=True)
    probe.bind(model)
    with probe:
        probe.phase("forward")
        x = buffer[:ROWS]
        hidden = _split_k_forward(x, model[0].weight)
        _split_k_forward(hidden.bfloat16(), model[1].weight)
        probe.phase("backward", 1)
        planted(buffer, x, torch.randn(ROWS, IN))
    return [(e.role, e.layer) for e in probe.events if e.phase == "backward"]


def test_wgrad_halves_over_casts_of_row_slices_are_the_layer_s():
    assert _backward_gemms(lambda buffer, x, g: _wgrad_rows(g, x)) == [("wgrad", 0)] * 2


def test_a_gemm_over_bytes_no_layer_read_stays_unattributed():
    """The rows of the buffer after layer 0's input: the same storage, no overlap with any layer's input."""
    assert _backward_gemms(lambda buffer, x, g: _wgrad_rows(g, buffer[ROWS:])) == [("wgrad", None)] * 2


def test_a_gemm_over_bytes_overwritten_since_the_forward_stays_unattributed():
    """Layer 0's input rows hold other data by backward (a buffer reused in place): not its input any more."""
    def planted(buffer: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> None:
        x.add_(1)
        _wgrad_rows(g, x)
    assert _backward_gemms(planted) == [("wgrad", None)] * 2
