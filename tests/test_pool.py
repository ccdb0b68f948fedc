"""The rank pool: hangs and crashes fail the case naming the rank, leave no process, and the pool recovers;
planted wrapper faults are caught by the reshard-timing and parity checks."""
from __future__ import annotations

import os
import signal
import time

import pytest

from te_verify.distributed.pool import RankFailure, RankPool, process_gone
from te_verify.distributed.verify import verify_dist
from te_verify.distributed.wrappers import Wrapped, wrap_ddp, wrap_fsdp2
from te_verify.matrix_dist import MIDDLE, _spec

HANG_TIMEOUT_S = 3.0


def all_reduce_rank_sum(rank: int, world_size: int, payload: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + payload)])
    dist.all_reduce(t)
    return int(t.item())


def hang_on_rank_1(rank: int, world_size: int, payload) -> str:
    if rank == 1:
        time.sleep(3600)
    return "done"


def kill_rank_1(rank: int, world_size: int, payload) -> str:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


def defer_reshard_fsdp2(model, spec) -> Wrapped:
    """Planted fault: FSDP2 whose reshards during backward all run in a callback at the end of backward."""
    import torch

    wrapped = wrap_fsdp2(model, spec)
    pending = []

    def run_pending() -> None:
        while pending:
            pending.pop(0)()

    for layer in wrapped.layers:
        group = layer._get_fsdp_state()._fsdp_param_group

        def deferred(real=group.reshard) -> None:
            if torch._C._current_graph_task_id() == -1:  # not in backward: reshard as usual
                return real()
            if not pending:
                torch.autograd.Variable._execution_engine.queue_callback(run_pending)
            pending.append(real)

        group.reshard = deferred  # instance attribute: only this wrapper's groups are affected
    return wrapped


def ddp_skipping_first_weight(model, spec) -> Wrapped:
    """Planted fault: DDP that never all-reduces 0.weight's gradient."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    DDP._set_params_and_buffers_to_ignore_for_model(model, ["0.weight"])
    return wrap_ddp(model, spec)


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(world_size=2, case_timeout_s=30.0)
    yield pool
    pool.close(graceful=True)


def assert_gone(pids: list[int]) -> None:
    left = [pid for pid in pids if not process_gone(pid)]
    assert not left, f"pool left processes running: {left}"


def test_pool_runs_cases_and_reports_overhead(pool):
    results = [pool.run(all_reduce_rank_sum, k).results for k in range(5)]
    assert results[-1] == [1 + 2 * 4, 1 + 2 * 4]
    figures = pool.overhead_figures()
    assert figures["overhead_median_s"] <= 0.25, figures


def test_hang_fails_naming_rank_and_leaves_nothing(pool):
    pool.start()
    pids, began = pool.pids, time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 hung") as info:
        pool.run(hang_on_rank_1, None, timeout_s=HANG_TIMEOUT_S)
    assert time.monotonic() - began < HANG_TIMEOUT_S + 10
    assert "hang_on_rank_1" in str(info.value)  # rank 1's stack, dumped by faulthandler
    assert "rank 0 finished" in str(info.value)
    assert_gone(pids)
    assert pool.run(all_reduce_rank_sum, 0).results == [1, 1]  # a fresh pool serves the next case


def test_crash_fails_naming_rank_and_signal(pool):
    pool.start()
    pids, starts, began = pool.pids, pool.starts, time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 died: killed by signal SIGKILL"):
        pool.run(kill_rank_1, None, timeout_s=HANG_TIMEOUT_S)
    assert time.monotonic() - began < HANG_TIMEOUT_S + 10
    assert_gone(pids)
    assert pool.run(all_reduce_rank_sum, 1).results == [3, 3]
    assert pool.starts == starts + 1


def test_clean_fsdp2_passes_reshard_timing(pool):
    spec = _spec("dist_fsdp2", "fsdp2", MIDDLE, True)
    verdicts = {v.check: v for v in verify_dist(spec, pool, {})}
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values() if not v.ok]
    assert verdicts["reshard_timing"].figures["reshard_frozen_layers_checked"] == 1


def test_planted_deferred_reshard_is_caught(pool):
    spec = _spec("dist_fsdp2", "fsdp2", MIDDLE, True)
    verdicts = {v.check: v for v in verify_dist(spec, pool, {}, wrap=defer_reshard_fsdp2)}
    assert verdicts["dist_grad_parity"].ok  # the fault costs memory, not correctness
    assert not verdicts["reshard_timing"].ok
    assert "frozen layer 1: still holds" in verdicts["reshard_timing"].message


def test_planted_skipped_allreduce_is_caught_by_parity(pool):
    spec = _spec("dist_ddp", "ddp", MIDDLE, True)
    verdicts = {v.check: v for v in verify_dist(spec, pool, {}, wrap=ddp_skipping_first_weight)}
    assert not verdicts["dist_grad_parity"].ok
    assert "grad of 0.weight" in verdicts["dist_grad_parity"].message
    assert "grad of 1." not in verdicts["dist_grad_parity"].message
