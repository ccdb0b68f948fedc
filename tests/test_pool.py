"""The rank pool: hangs and crashes fail the case naming the rank, leave no process, and the pool recovers;
planted wrapper faults are caught by the reshard-timing and parity checks."""
from __future__ import annotations

import os
import signal
import time

import pytest

from te_verify.distributed.pool.pool import RankFailure, RankPool, process_gone
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import MIDDLE, _spec
from planted_wrappers import (ddp_all_reducing_frozen_copies, ddp_broadcasting_params, ddp_engine,
                              ddp_engine_decaying_frozen, ddp_engine_without_state, ddp_extra_gemm,
                              ddp_skipping_first_weight, ddp_wrong_output, ddp_writing_frozen_weight,
                              ddp_keeping_every_output, ddp_unfreezing_after_backward,
                              ddp_writing_its_input, defer_reshard_fsdp2, fsdp2_without_probe)

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


def sleep_s(rank: int, world_size: int, seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@pytest.mark.system
def test_a_stacks_first_case_in_a_pool_may_also_take_its_import_time_and_only_the_first():
    """A case that imports its engine's stack in the ranks (TE over the emulation, Megatron: over 60 s on a loaded
    machine) is not hung for it; the allowance is once per stack and pool. Planted: the same slow case without it."""
    pool = RankPool(world_size=2, case_timeout_s=2.0)
    try:
        pool.run(sleep_s, 0.0, imports="this module")  # the ranks import this file
        assert pool.run(sleep_s, 4.0, imports="engine").results == ["done", "done"]
        with pytest.raises(RankFailure, match=r"hung \(no reply within 2 s\)"):
            pool.run(sleep_s, 4.0, imports="engine")
        pool.run(sleep_s, 0.0, imports="this module")  # a fresh pool: its ranks import again
        with pytest.raises(RankFailure, match=r"hung \(no reply within 2 s\)"):
            pool.run(sleep_s, 4.0)
    finally:
        pool.close(graceful=True)


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


def start_warm(pool) -> None:
    """Start the ranks and let each import this module once: on a loaded machine that import alone can take
    longer than HANG_TIMEOUT_S, and a rank still importing reads as hung."""
    pool.start()
    pool.run(all_reduce_rank_sum, 0)


@pytest.mark.system
def test_hang_fails_naming_rank_and_leaves_nothing(pool):
    start_warm(pool)
    pids, began = pool.pids, time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 hung") as info:
        pool.run(hang_on_rank_1, None, timeout_s=HANG_TIMEOUT_S)
    assert time.monotonic() - began < HANG_TIMEOUT_S + 10
    assert "hang_on_rank_1" in str(info.value)  # rank 1's stack, dumped by faulthandler
    assert "rank 0 finished" in str(info.value)
    assert_gone(pids)
    assert pool.run(all_reduce_rank_sum, 0).results == [1, 1]  # a fresh pool serves the next case


def test_crash_fails_naming_rank_and_signal(pool):
    start_warm(pool)
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


def test_sharding_wrapper_without_probe_is_not_observed_never_passed(pool):
    spec = _spec("dist_fsdp2", "fsdp2", MIDDLE, True)
    verdicts = {v.check: v for v in verify_dist(spec, pool, {}, wrap=fsdp2_without_probe)}
    assert verdicts["dist_grad_parity"].ok
    for check in ("reshard_timing", "gathered_peak"):
        assert not verdicts[check].ok and f"{check} not observed" in verdicts[check].message, verdicts[check].message


def _planted_ddp(pool, wrap) -> dict:
    """Verdicts, by check, of the MIDDLE stack under DDP with a planted `wrap`."""
    return {v.check: v for v in verify_dist(_spec("dist_ddp", "ddp", MIDDLE, True), pool, {}, wrap=wrap)}


def test_planted_skipped_allreduce_is_caught_by_parity(pool):
    verdicts = _planted_ddp(pool, ddp_skipping_first_weight)
    assert not verdicts["dist_grad_parity"].ok
    assert "grad of 0.weight" in verdicts["dist_grad_parity"].message
    assert "grad of 1." not in verdicts["dist_grad_parity"].message


def test_planted_wrong_output_is_caught_by_output_parity_only(pool):
    verdicts = _planted_ddp(pool, ddp_wrong_output)
    assert verdicts["dist_grad_parity"].ok and verdicts["dist_state_left_behind"].ok
    message = verdicts["dist_output_parity"].message
    assert "backend ddp rank 0: forward output (iteration 1): max abs err" in message and "ddp rank 1" in message


def test_planted_write_into_a_frozen_weight_is_caught_by_state_left_behind(pool):
    verdicts = _planted_ddp(pool, ddp_writing_frozen_weight)
    assert verdicts["dist_grad_parity"].ok and verdicts["dist_output_parity"].ok
    message = verdicts["dist_state_left_behind"].message
    assert "param:1.weight after the run: max abs err" in message and "rtol=0, atol=0" in message
    assert "param:0.weight" not in message


def test_planted_extra_gemm_is_caught_by_the_ranks_flops(pool):
    verdicts = _planted_ddp(pool, ddp_extra_gemm)
    message = verdicts["dist_waste_flops"].message
    assert "[ddp rank 0, its shard (4,)]: FLOPs" in message and "[ddp rank 1" in message
    assert "forward: layer 0 (trainable weight): 2 fprop GEMM, 1 required" in message


def test_planted_broadcast_of_frozen_values_is_caught_naming_parameter_and_phase(pool):
    verdicts = _planted_ddp(pool, ddp_broadcasting_params)
    failed = {name for name, v in verdicts.items() if not v.ok}
    assert failed == {"frozen_collectives"}, failed  # values only: every gradient and its reduction are DDP's
    message = verdicts["frozen_collectives"].message
    assert "ranks 0, 1: broadcast in forward carried the values of frozen 1.weight (4,096 B)" in message
    assert "frozen 1.bias" in message and "0.weight" not in message  # trainable ones are not this check's


def test_planted_reduction_of_frozen_value_copies_is_named_by_content(pool):
    verdicts = _planted_ddp(pool, ddp_all_reducing_frozen_copies)
    assert verdicts["gradient_volume"].ok, verdicts["gradient_volume"].message  # values, not gradients
    message = verdicts["frozen_collectives"].message
    assert "all_reduce in backward_end carried the values of frozen 1.weight (4,096 B)" in message, message
    assert "frozen 1.bias (128 B)" in message


def test_planted_cache_growing_every_step_fails_memory_retained_naming_rank_and_holder(pool):
    verdicts = _planted_ddp(pool, ddp_keeping_every_output)
    failed = {name for name, v in verdicts.items() if not v.ok}
    assert failed == {"memory_retained"}, failed
    message = verdicts["memory_retained"].message
    for rank in (0, 1):  # each rank's shard of the output: 4 rows x 32 fp32
        assert f"backend ddp[rank {rank}]: a training step after the measured one retained 512 B" in message, message
    assert "held by the wrapper (closure kept)[3]" in message, message


def test_planted_write_into_the_input_shard_fails_inputs_left_only(pool):
    verdicts = _planted_ddp(pool, ddp_writing_its_input)
    failed = {name for name, v in verdicts.items() if not v.ok}
    assert failed == {"inputs_left"}, failed
    message = verdicts["inputs_left"].message
    assert "backend ddp[rank 1]" in message and "input x: written by the run (128 of 128 elements changed" in message


def test_planted_unfreezing_after_backward_fails_requires_grad_left_naming_parameters(pool):
    verdicts = _planted_ddp(pool, ddp_unfreezing_after_backward)
    assert not verdicts["requires_grad_left"].ok
    message = verdicts["requires_grad_left"].message
    assert "backend ddp[rank 0]" in message and "parameter 1.weight: requires_grad True after the run, expected False" \
        in message, message
    assert "0.weight" not in message  # trainable ones are unchanged


def test_clean_ddp_passes_every_rank_check_with_figures(pool):
    spec = _spec("dist_ddp", "ddp", MIDDLE, True)
    figures = {}
    verdicts = {v.check: v for v in verify_dist(spec, pool, figures)}
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values() if not v.ok]
    assert {"dist_output_parity", "dist_state_left_behind", "dist_waste_flops", "dist_waste_saved",
            "frozen_collectives"} <= set(verdicts)
    assert verdicts["dist_waste_flops"].figures["flops_ratio"] == 1.0 and figures["peak_bytes"] > 0


def gather_in_flight_then_settle(rank: int, world_size: int, payload) -> bool:
    """Rank 0 starts an all-gather rank 1 joins a second later; whether it is done once settle_collectives returns."""
    import torch
    import torch.distributed as dist

    from te_verify.distributed.rank.case_runner import settle_collectives

    out, mine = torch.empty(2 * world_size), torch.full((2,), float(rank))
    if rank == 1:
        time.sleep(1.0)
    work = dist.all_gather_into_tensor(out, mine, async_op=True)
    settle_collectives()
    return work.is_completed() and out.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_settling_waits_for_a_collective_still_in_flight(pool):
    assert pool.run(gather_in_flight_then_settle, None).results == [True, True]


def unsettled_cases(rank: int, world_size: int, payload) -> int:
    from te_verify.distributed.rank import case_runner

    return len(case_runner._UNSETTLED)


def ddp_raising_after_forward(model, spec):
    raise RuntimeError("planted: the wrapper raised on every rank")


def test_a_case_raised_on_every_rank_keeps_its_buffers_until_the_next_case_settles(pool):
    verdicts = _planted_ddp(pool, ddp_raising_after_forward)
    assert any("planted: the wrapper raised" in v.message for v in verdicts.values())
    assert pool.run(unsettled_cases, None).results == [1, 1]  # kept: its collectives may still write into them
    assert all(v.ok for v in _planted_ddp(pool, None).values())
    assert pool.run(unsettled_cases, None).results == [0, 0]


def synchronous_megatron_fsdp_collectives(rank: int, world_size: int, payload) -> list:
    """megatron_fsdp's SYNC_STEP on a module of its own: plain and coalesced async collectives are done on return."""
    import types

    import torch

    from te_verify.compat.cuda_stand_in import TorchProxy
    from te_verify.distributed.engines.megatron_fsdp import CompletedWork, synchronous_collectives

    module = types.ModuleType("confined")
    module.torch = TorchProxy("confined", ())
    synchronous_collectives(module)
    plain, coalesced, mine = torch.empty(2 * world_size), torch.empty(2 * world_size), torch.full((2,), rank + 1.0)
    work = module.torch.distributed.all_gather_into_tensor(plain, mine, async_op=True)
    with module._coalescing_manager(None, async_ops=True) as manager:
        module.torch.distributed.all_gather_into_tensor(coalesced, mine, async_op=True)
    done = coalesced.tolist()  # read before any wait
    manager.wait()
    return [isinstance(work, CompletedWork), plain.tolist(), done]


def test_megatron_fsdps_cpu_step_finishes_its_collectives_before_they_return(pool):
    expected = [True, [1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]
    assert pool.run(synchronous_megatron_fsdp_collectives, None).results == [expected, expected]


def test_a_users_engine_is_judged_like_a_built_in_one(pool):
    """A declared wrapper with train= gets params_after_steps and engine_state, and its microbatches' backward is
    watched for reshard_timing; a weight decay reaching frozen weights fails params_after_steps alone."""
    clean = _planted_ddp(pool, ddp_engine)
    assert all(v.ok for v in clean.values()), [v.message for v in clean.values() if not v.ok]
    assert {"params_after_steps", "engine_state", "reshard_timing"} <= set(clean)
    decaying = _planted_ddp(pool, ddp_engine_decaying_frozen)
    assert {name for name, v in decaying.items() if not v.ok} == {"params_after_steps"}
    assert "1.weight" in decaying["params_after_steps"].message, decaying["params_after_steps"].message
    stateless = _planted_ddp(pool, ddp_engine_without_state)
    assert "engine_state not observed: its TrainStep declares no state()" in stateless["engine_state"].message
