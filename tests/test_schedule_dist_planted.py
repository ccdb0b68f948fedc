"""Freeze schedules in the distributed lane: a data-parallel wrapper that reduces only the parameters trainable when
it wrapped (DDP's static buckets) leaves a parameter unfrozen later rank-local, and dist_schedule_parity fails naming
it and the iteration (and gradient_volume the bytes it did not reduce); its clean twin, which hooks every parameter that needs a gradient at each call, passes.
Also waste from the second iteration on (issue 36, item 1), in this module for its rank pool: a wrapper that from its
second call all-reduces the frozen parameters too fails frozen_collectives naming iteration 2; one that from its second
call computes a frozen layer's weight gradient (and saves its input for it) fails dist_waste_flops and dist_waste_saved
naming iterations 2-4 on every rank; their twins pass."""
from __future__ import annotations

import pytest

from planted_iterations import (dp_losing_frozen_after_first_call, dp_recompiling_correctly_after_first_call,
                                dp_switching_correctly_after_first_call, dp_syncing_frozen_after_first_call)
from planted_wrappers import dp_hooking_every_trainable, dp_hooking_trainable_at_wrap
from te_verify.distributed.pool.pool import RankPool
from te_verify.checks.verdict import Verdict
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import _spec
from te_verify.matrix.tiers import named_masks

PREFIX = named_masks(4)["prefix"]
UNFREEZE = _spec("dist_schedule", "ddp", PREFIX).replace(schedule=((2, "unfreeze_all"),))


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(world_size=2, case_timeout_s=60.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap) -> dict:
    return {v.check: v for v in verify_dist(UNFREEZE, pool, {}, wrap=wrap)}


def test_wrapper_reducing_only_what_trained_at_wrap_time_fails_naming_the_unfrozen_parameter(pool):
    verdicts = _verdicts(pool, dp_hooking_trainable_at_wrap)
    schedule = verdicts["dist_schedule_parity"]
    assert not schedule.ok
    for rank in (0, 1):
        for name in ("0.weight", "0.bias", "1.weight", "1.bias"):
            assert f"rank {rank}: iteration 2: grad of {name}: max abs err" in schedule.message
        assert f"rank {rank}: iteration 3: grad of 0.weight: max abs err" in schedule.message
    assert "grad of 2.weight" not in schedule.message  # reduced since the wrap
    assert verdicts["dist_grad_parity"].ok  # iteration 1, before the change, is right
    volume = verdicts["gradient_volume"].message  # each iteration's collectives against what trains in it
    assert "iteration 2:" in volume and "iteration 3:" in volume and "some were not reduced" in volume, volume


def test_clean_twin_hooking_every_trainable_parameter_at_each_call_passes(pool):
    verdicts = _verdicts(pool, dp_hooking_every_trainable)
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert not failed, failed
    assert verdicts["dist_schedule_parity"].figures == {"schedule_iterations_compared": 2,
                                                          "schedule_grads_compared": 2 * 2 * 8}


def _dist_verdicts(pool, wrap) -> dict[str, Verdict]:
    return {v.check: v for v in verify_dist(_spec("dist_iterations", "ddp", PREFIX), pool, {}, wrap=wrap)}


def test_wrapper_syncing_frozen_parameters_from_iteration_2_fails_frozen_collectives_naming_it(pool):
    verdicts = _dist_verdicts(pool, dp_syncing_frozen_after_first_call)
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert set(failed) == {"frozen_collectives"}, failed
    message = failed["frozen_collectives"]
    assert message.startswith("iteration 2: "), message
    assert "all_reduce in backward_end carried the values of frozen 0.weight (4,096 B)" in message
    assert "iteration 1" not in message


def test_clean_twin_wrapper_switching_its_reduction_after_the_first_call_passes(pool):
    verdicts = _dist_verdicts(pool, dp_switching_correctly_after_first_call)
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert not failed, failed
    assert verdicts["frozen_collectives"].figures["frozen_collectives_iterations"] == 4


ALTERNATING = _spec("dist_iterations", "ddp", named_masks(4)["alternating"])  # layer 2: frozen, its input needs grad


def test_wrapper_computing_frozen_wgrad_from_iteration_2_fails_rank_waste_naming_it(pool):
    verdicts = {v.check: v for v in verify_dist(ALTERNATING, pool, {}, wrap=dp_losing_frozen_after_first_call)}
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert set(failed) == {"dist_waste_flops", "dist_waste_saved"}, failed
    for rank in (0, 1):
        assert (f"iteration 2: {ALTERNATING.id} [ddp rank {rank}, its shard (4,)]: FLOPs 73,728 vs 65,536 required"
                in failed["dist_waste_flops"]), failed["dist_waste_flops"]
    flops = failed["dist_waste_flops"]
    assert "layer 2 (frozen weight): 1 wgrad GEMM, 0 required" in flops, flops
    assert "iteration 3: " in flops and "iteration 4: " in flops and "iteration 1" not in flops
    assert failed["dist_waste_saved"].startswith("iteration 2: "), failed["dist_waste_saved"]
    assert verdicts["dist_waste_flops"].figures["waste_iterations_judged"] == 4


def test_clean_twin_wrapper_recompiling_to_split_k_after_the_first_call_passes_every_iteration(pool):
    verdicts = {v.check: v for v in verify_dist(ALTERNATING, pool, {}, wrap=dp_recompiling_correctly_after_first_call)}
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert not failed, failed
    assert verdicts["dist_waste_saved"].figures["waste_iterations_judged"] == 4
