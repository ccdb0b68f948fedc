"""The training engines' helpers and checks on their own: eager SGD's trajectory, parameters after each step,
state kept per rank, the strict CUDA stand-in, and counting a library's captured alias of a collective."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist

from te_verify.checks.collectives import ParamInfo
from te_verify.checks.tolerances import Tolerance
from te_verify.checks.training import engine_state, params_after_steps
from te_verify.compat.cuda_stand_in import CudaPathError, confine
from te_verify.distributed.rank.observe import CollectiveCounter
from te_verify.distributed.rank.training import eager_trajectory
from te_verify.training import StateBytes
from te_verify.training import LR
from te_verify.matrix.dist import LORA_QV, MIDDLE, _lora_spec, _spec
from te_verify.models import frozen_at_backward, make_inputs

TOL = Tolerance(rtol=1.3e-6, atol=1e-5, source="test")
SPEC = _spec("dist_megatron_ddp", "megatron_ddp", MIDDLE, True)
PARAMS = [ParamInfo("0.weight", (32, 32), 4, True, 0), ParamInfo("0.bias", (32,), 4, True, 0),
          ParamInfo("1.weight", (32, 32), 4, False, 1), ParamInfo("1.bias", (32,), 4, False, 1)]


def test_eager_trajectory_is_sgd_on_the_global_batch_and_leaves_frozen_parameters_alone():
    steps = eager_trajectory(SPEC.replace(iterations=2))
    model, inputs = frozen_at_backward(SPEC), make_inputs(SPEC)
    model(inputs.x.detach()).backward(inputs.grad_output)
    first = {n: p.detach() - LR * p.grad if p.requires_grad else p.detach() for n, p in model.named_parameters()}
    assert len(steps) == 2
    for name, value in first.items():
        torch.testing.assert_close(steps[0][name], value)
    assert torch.equal(steps[1]["1.weight"], model[1].weight.detach())  # frozen middle layer
    assert not torch.equal(steps[1]["0.weight"], steps[0]["0.weight"])  # momentum keeps it moving


def test_the_fp64_trajectory_of_a_token_model_keeps_its_ids_integer():
    """A declared engine may run dist_lora's LitGPT cases: the fp64 truth casts the model, never its token ids."""
    spec = _lora_spec("ddp", LORA_QV, kind="litgpt_lora")
    assert not make_inputs(spec).x.is_floating_point()
    steps = eager_trajectory(spec, torch.float64)
    assert len(steps) == spec.iterations and all(t.dtype == torch.float64 for t in steps[-1].values())
    adapter = "transformer.h.0.attn.qkv.lora_A"  # it trains: each step moves it
    assert not torch.equal(steps[-1][adapter], steps[0][adapter]) and bool(steps[-1][adapter].isfinite().all())


def _after(steps, **changes):
    out = [{k: v.clone() for k, v in s.items()} for s in steps]
    for key, fn in changes.items():
        k, name = key.split("__")
        out[int(k)][name.replace("_", ".")] = fn(out[int(k)][name.replace("_", ".")])
    return out


def test_params_after_steps_passes_equal_and_names_rank_step_and_parameter():
    want = eager_trajectory(SPEC.replace(iterations=2))
    frozen = {"1.weight", "1.bias"}
    assert params_after_steps("c", "e", want, {0: want, 1: want}, frozen, TOL).ok
    off = _after(want, **{"1__3_weight": lambda t: t * 1.01})
    verdict = params_after_steps("c", "e", want, {0: want, 1: off}, frozen, TOL)
    assert not verdict.ok and "rank 1, after step 2, 3.weight" in verdict.message, verdict.message
    nudged = _after(want, **{"0__1_bias": lambda t: t + 1e-7})  # within tolerance, but frozen: bitwise
    verdict = params_after_steps("c", "e", want, {0: nudged}, frozen, TOL)
    assert not verdict.ok and "after step 1, frozen 1.bias: changed" in verdict.message, verdict.message
    verdict = params_after_steps("c", "e", want, {0: want[:1]}, frozen, TOL)
    assert not verdict.ok and "1 steps taken, 2 expected" in verdict.message


def test_engine_state_passes_the_trainable_room_and_names_frozen_room():
    need = (32 * 32 + 32) * 4
    ok = {0: {"optimizer_state": StateBytes(need, False), "grad_buffer": StateBytes(need, False)}}
    assert engine_state("c", "e", ok, PARAMS, 2).ok
    over = {1: {"optimizer_state": StateBytes(need + 32 * 32 * 4, False)}}
    verdict = engine_state("c", "e", over, PARAMS, 2)
    assert not verdict.ok and "rank 1: optimizer_state holds 8,320 B" in verdict.message, verdict.message
    assert "made in step" in verdict.message and "the size of 1.weight" in verdict.message
    sharded = {0: {"master": StateBytes(need // 2 + 64, True)}}  # a rank's half of the frozen bias
    verdict = engine_state("c", "e", sharded, PARAMS, 2)
    assert not verdict.ok and "the size of 1.bias" in verdict.message and "made in wrap" in verdict.message
    assert engine_state("c", "e", {0: {"master": StateBytes(need // 2 + 64, True, slack=64)}}, PARAMS, 2).ok


def test_cuda_stand_in_answers_only_what_the_step_covers():
    module = types.ModuleType("te_verify_fake_engine")
    module.torch = torch
    sys.modules[module.__name__] = module
    try:
        confine(module.__name__, ("current_device",), "fake-step")
        assert module.torch.cuda.current_device() == "cpu"
        assert module.torch.zeros(1).shape == (1,)  # the rest of torch is torch's
        with pytest.raises(CudaPathError, match="te_verify_fake_engine called torch.cuda.Stream"):
            module.torch.cuda.Stream()
        assert torch.cuda.current_device is not module.torch.cuda.current_device  # torch itself is untouched
    finally:
        del sys.modules[module.__name__]


def test_counter_patches_a_library_alias_of_a_collective_and_restores_it():
    module = types.ModuleType("te_verify_fake_library")
    module.reduce_scatter_func = dist.reduce_scatter_tensor  # bound at import, as megatron-core does
    sys.modules[module.__name__] = module
    try:
        counter = CollectiveCounter()
        with counter.patched():
            assert module.reduce_scatter_func.__name__ == "counted"
        assert module.reduce_scatter_func is dist.reduce_scatter_tensor
    finally:
        del sys.modules[module.__name__]


def _gather(name: str, nbytes: int, phase: str = "forward", iteration: int = 0, microbatch: int = 0):
    from te_verify.checks.collectives import Carried, Collective

    return Collective("all_gather", 2 * nbytes, phase, (Carried(name, "values", nbytes),), iteration, microbatch)


def test_frozen_gathers_are_counted_per_iteration_and_microbatch_and_a_stale_row_is_not_a_gather():
    from te_verify.checks.collectives import frozen_collectives
    from te_verify.checks.reshard import LayerInfo

    units = [LayerInfo(4224, True, True), LayerInfo(4224, False, True)]
    judge = lambda calls: frozen_collectives("c", "e", {0: calls}, PARAMS, units, shards=True, regathers=True)
    shard = 2048  # a rank's share of frozen 1.weight (4,096 B) over 2 ranks
    assert judge([_gather("1.weight", shard, iteration=k, microbatch=m) for k in (0, 1) for m in (0, 1)]).ok
    assert judge([_gather("1.weight", shard), _gather("1.weight", 128)]).ok  # stale padding: one row
    twice = judge([_gather("1.weight", shard), _gather("1.weight", shard)])
    assert not twice.ok and "rank 0: all_gather in forward carried the values of frozen 1.weight (2,048 B): " \
        "gathered 2 times in forward, once needed" in twice.message, twice.message
    after_step = judge([_gather("1.weight", shard), _gather("1.weight", shard, phase="step")])
    assert not after_step.ok and "all_gather in step carried the values of frozen 1.weight" in after_step.message


def test_eager_trajectory_and_params_after_steps_follow_a_freeze_schedule():
    """Layer 0 frozen before iteration 2 (freeze_all_but_last on a stack training everything): eager SGD leaves it
    alone from step 2 on (its grad None: torch's SGD skips it, momentum and all), and the check holds it bitwise
    there, while step 1 still judges it as trained."""
    spec = _spec("dist_schedule", "megatron_ddp", (False, False), widths=(8, 8, 8)).replace(
        schedule=((2, "freeze_all_but_last"),))
    want = eager_trajectory(spec)
    assert torch.equal(want[1]["0.weight"], want[0]["0.weight"]) and torch.equal(want[2]["0.bias"], want[0]["0.bias"])
    assert not torch.equal(want[1]["1.weight"], want[0]["1.weight"])
    frozen = [set(), {"0.weight", "0.bias"}, {"0.weight", "0.bias"}]
    assert params_after_steps("c", "e", want, {0: want}, frozen, TOL).ok
    moved = _after(want, **{"1__0_weight": lambda t: t + 1e-7})  # a step that kept moving the frozen weight
    verdict = params_after_steps("c", "e", want, {0: moved}, frozen, TOL)
    assert not verdict.ok and "after step 2, frozen 0.weight: changed" in verdict.message, verdict.message
    assert params_after_steps("c", "e", want, {0: _after(want, **{"0__0_weight": lambda t: t + 1e-7})}, frozen,
                              TOL).ok  # step 1 trained it: within the tolerance
