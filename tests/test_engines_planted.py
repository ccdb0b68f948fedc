"""Training engines' checks: parameters after every step, the state kept per rank, and what is communicated about
frozen parameters over whole iterations. Clean Megatron-core DDP (stack and TE Linear with fuse_wgrad_accumulation)
and DeepSpeed ZeRO-1/2 pass; each planted fault fails the check it is about, naming the parameter and the phase."""
from __future__ import annotations

import pytest

from te_verify import compat
from te_verify.distributed.pool.pool import RankPool
from te_verify.distributed.rank.case_runner import DistCase, run_dist_case
from te_verify.distributed.verify import dist_verdicts, verify_dist
from te_verify.matrix.dist import MIDDLE, _spec
from te_verify.spec import ITERATIONS, TEConfig
from planted_engines import (megatron_ddp_gathering_frozen_after_step, megatron_ddp_reducing_frozen_grads,
                             megatron_ddp_with_main_grad_for_frozen, megatron_ddp_with_state_for_frozen)

OPTIONS = (("microbatches", 2), ("overlap_grad_reduce", True))


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(world_size=2, case_timeout_s=60.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap=None, te: bool = False) -> dict:
    spec = _spec("dist_megatron_ddp", "megatron_ddp", MIDDLE, True, OPTIONS)
    if te:
        spec = spec.replace(te=TEConfig(main_grad=True, grad_added_to_main_grad=True))
    return {v.check: v for v in verify_dist(spec, pool, {}, wrap=wrap)}


def _failed(verdicts: dict) -> set[str]:
    return {name for name, v in verdicts.items() if not v.ok}


@pytest.mark.parametrize("te", [False, True], ids=["torch_linear", "te_linear_fused_wgrad"])
@pytest.mark.system
def test_clean_megatron_ddp_passes_every_check_over_its_steps(pool, te):
    verdicts = _verdicts(pool, te=te)
    assert not _failed(verdicts), {k: verdicts[k].message for k in _failed(verdicts)}
    assert {"params_after_steps", "engine_state", "frozen_collectives", "gradient_volume"} <= set(verdicts)
    assert verdicts["params_after_steps"].figures["steps_compared"] == ITERATIONS
    assert any(step.startswith("megatron-core-cpu-device") for step in compat.APPLIED)  # the header lists it
    assert verdicts["engine_state"].figures["grad_buffer_bytes"] == verdicts["engine_state"].figures[
        "grad_buffer_bytes_needed"]  # no room for frozen 1.weight, 1.bias


@pytest.mark.parametrize("engine", ["deepspeed_zero1", "deepspeed_zero2"])
def test_clean_deepspeed_zero1_and_zero2_pass_every_check(pool, engine):
    spec = _spec("dist_deepspeed", engine, MIDDLE, True, (("microbatches", 2),))
    verdicts = {v.check: v for v in verify_dist(spec, pool, {})}
    assert not _failed(verdicts), {k: verdicts[k].message for k in _failed(verdicts)}
    assert verdicts["engine_state"].figures["master_bytes"] == verdicts["engine_state"].figures["master_bytes_needed"]
    assert verdicts["reshard_timing"].figures == {"reshard_compared": "nothing sharded: no gathers to time"}


def test_zero3_probe_sees_each_layer_gathered_for_its_backward_and_freed_after(pool):
    """The measured timeline of ZeRO-3 (threshold 0: every parameter partitioned): layer k's full parameters are held
    at grad_done(k+1) (gathered for its backward) and not at grad_done(k); nothing is held at either end. No layer
    stays gathered from forward: te_verify's own observers read no parameter through ZeRO-3's ZeROOrderedDict (which
    would gather it as an external parameter of the root, held to the end of backward)."""
    spec = _spec("dist_deepspeed", "deepspeed_zero3", MIDDLE, True, (("persistence_threshold", 0),))
    result = pool.run(run_dist_case, DistCase(spec))
    layer = 32 * 33 * 4
    assert result.results[0].timeline == [
        ("backward_start", 4, [0, 0, 0, 0]), ("grad_done", 4, [0, 0, 0, layer]), ("grad_done", 3, [0, 0, layer, 0]),
        ("grad_done", 2, [0, layer, 0, 0]), ("grad_done", 1, [layer, 0, 0, 0]), ("grad_done", 0, [0, 0, 0, 0]),
        ("backward_end", -1, [0, 0, 0, 0])]
    verdicts = {v.check: v for v in dist_verdicts(spec, result)}
    assert verdicts["reshard_timing"].ok and verdicts["reshard_timing"].figures["reshard_frozen_layers_checked"] == 1
    assert verdicts["gathered_peak"].ok and verdicts["gathered_peak"].figures["peak_gathered_bytes_actual"] == layer


def test_optimizer_state_for_frozen_parameters_fails_engine_state_naming_them_and_the_step(pool):
    verdicts = _verdicts(pool, megatron_ddp_with_state_for_frozen)
    assert _failed(verdicts) == {"engine_state"}
    message = verdicts["engine_state"].message
    assert "optimizer_state holds" in message and "made in step" in message, message
    assert "the size of 1.weight, 1.bias" in message, message


def test_all_gather_of_frozen_parameters_after_every_step_fails_frozen_collectives(pool):
    verdicts = _verdicts(pool, megatron_ddp_gathering_frozen_after_step)
    assert _failed(verdicts) == {"frozen_collectives"}
    message = verdicts["frozen_collectives"].message
    assert "all_gather in step carried the values of frozen 1.weight (4,096 B)" in message, message
    assert "frozen 1.bias" in message and "0.weight" not in message


def test_reduction_of_frozen_gradients_fails_naming_parameter_and_phase(pool):
    verdicts = _verdicts(pool, megatron_ddp_reducing_frozen_grads)
    assert {"frozen_collectives", "gradient_volume"} <= _failed(verdicts)
    message = verdicts["frozen_collectives"].message
    assert "all_reduce in backward_end carried the gradient of frozen 1.weight (4,096 B)" in message, message
    assert "iteration 1" in verdicts["gradient_volume"].message and "1.weight" in verdicts["gradient_volume"].message


def test_main_grad_for_a_frozen_te_weight_fails_presence(pool):
    verdicts = _verdicts(pool, megatron_ddp_with_main_grad_for_frozen, te=True)
    assert "dist_grad_parity" in _failed(verdicts)
    assert "1.weight" in verdicts["dist_grad_parity"].message, verdicts["dist_grad_parity"].message
