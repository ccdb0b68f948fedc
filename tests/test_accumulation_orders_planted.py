"""Accumulation orders outside the TE lane (issue 34, item 5), on planted faults (tests/planted_orders.py) that only
every-forward-first shows. Torch lane: a Linear whose wgrad reads its latest forward's input passes interleaved
microbatches and fails forwards-first, grad_parity naming the trained weights; the clean twin (matmul then a bias
add, its input saved on the autograd context) passes both. Distributed lane: a data-parallel wrapper that arms its
reduction in forward, as DDP does, reduces after the first backward only and fails dist_grad_parity naming the
trained weights on both ranks; its twin, reducing in the backward outside no_sync, passes every check."""
from __future__ import annotations

import pytest

from planted_accumulation import OtherAccumulation
from planted_orders import LastInputWgrad, dp_syncing_by_forward, dp_syncing_in_backward
from te_verify.checks.verdict import CheckFailures
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import accumulation_specs as dist_specs
from te_verify.matrix.stacks import accumulation_specs
from te_verify.run.accumulation import verify_accumulation
from te_verify.run.caserun import CaseRun

ORDERS = ("interleaved", "forwards_first")
FIRST = accumulation_specs("pr")[0]  # the alternating mask: layers 1 and 3 train
DDP_FIRST = next(s for s in dist_specs("pr") if s.dist.wrapper == "ddp")  # the frozen middle layer: 0, 2, 3 train


def _failed(backend, spec) -> dict[str, str]:
    case = CaseRun(spec, backend.name, backend)
    try:
        verify_accumulation(case)
    except CheckFailures:
        pass
    return {v.check: v.message for v in case.verdicts if not v.ok}


@pytest.mark.parametrize("order", ORDERS)
def test_torch_lane_clean_twin_passes_both_orders(order):
    assert _failed(OtherAccumulation(), FIRST.replace(accumulation=order)) == {}


def test_torch_lane_wgrad_from_the_latest_forward_is_caught_only_forwards_first():
    assert _failed(LastInputWgrad(), FIRST.replace(accumulation="interleaved")) == {}
    failed = _failed(LastInputWgrad(), FIRST)
    assert {"grad_parity", "grad_accumulation", "params_after_steps"} <= set(failed), failed
    first = failed["grad_parity"]
    assert "grad of 1.weight" in first and "grad of 3.weight" in first, first
    assert ".bias" not in first  # a bias gradient needs no input: right in either order


@pytest.fixture
def pool(rank_pool):  # the session's pool: no pool start of its own
    return rank_pool


def _dist_failed(pool, wrap, order: str) -> dict[str, str]:
    return {v.check: v.message for v in verify_dist(DDP_FIRST.replace(accumulation=order), pool, {}, wrap=wrap)
            if not v.ok}


@pytest.mark.parametrize("order", ORDERS)
def test_dist_clean_twin_reducing_in_the_synchronised_backward_passes_both_orders(pool, order):
    assert _dist_failed(pool, dp_syncing_in_backward, order) == {}


def test_dist_wrapper_reducing_after_the_first_backward_only_is_caught_only_forwards_first(pool):
    assert _dist_failed(pool, dp_syncing_by_forward, "interleaved") == {}
    failed = _dist_failed(pool, dp_syncing_by_forward, "forwards_first")
    assert set(failed) == {"dist_grad_parity"}, failed
    for rank in (0, 1):
        for name in ("0.weight", "2.weight", "3.weight"):
            assert f"rank {rank}: grad of {name}" in failed["dist_grad_parity"], failed
    assert "1.weight" not in failed["dist_grad_parity"]  # frozen: no gradient to reduce
