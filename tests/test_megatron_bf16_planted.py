"""Megatron-core DDP with bf16 parameters and fp32 master weights (engines.megatron_bf16): an engine wrapper that
ignores grad_reduce_in_fp32 fails collective_dtypes naming the all-reduce (rank, index, phase, iteration); the engine as
configured and the same policy over the distributed optimizer pass every check (the pool tests run two gloo ranks:
system); the step's fp32 masters keep updates a bf16 parameter loses, and the reduce dtype maps to
grad_reduce_in_fp32 or is refused (cheap)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from planted_megatron_bf16 import megatron_bf16_as_specified, megatron_bf16_ignoring_grad_reduce_in_fp32
from te_verify.distributed.engines.megatron_bf16 import MasterStep, grad_reduce_in_fp32
from te_verify.distributed.types import WrapperError
from te_verify.matrix.engines import megatron_policy_specs
from te_verify.spec import TEConfig
from te_verify.training import sgd

SPEC = megatron_policy_specs("smoke")[0]  # frozen middle layer, input grad, two microbatches, fp32 reduction


@pytest.fixture(scope="module")
def pool():
    from te_verify.distributed.engines import engine
    from te_verify.distributed.pool.pool import RankPool

    if engine("megatron_ddp").unavailable():  # not imported here: Megatron loads TE, which the rank loads first
        pytest.skip(engine("megatron_ddp").unavailable())
    pool = RankPool(world_size=2, case_timeout_s=120.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap, spec=SPEC) -> dict:
    from te_verify.distributed.verify import verify_dist

    return {v.check: v for v in verify_dist(spec, pool, {}, wrap=wrap)}


def _failed(verdicts: dict) -> dict:
    return {name: v.message for name, v in verdicts.items() if not v.ok}


@pytest.mark.system
@pytest.mark.parametrize("distributed", [False, True], ids=["masters", "distributed_optimizer_master_shards"])
def test_the_engine_as_configured_passes_every_check(pool, distributed):
    spec = SPEC if not distributed else SPEC.replace(dist=dataclasses.replace(
        SPEC.dist, options=tuple(sorted((*SPEC.dist.options, ("use_distributed_optimizer", True))))))
    verdicts = _verdicts(pool, megatron_bf16_as_specified, spec)
    assert not _failed(verdicts), _failed(verdicts)
    assert verdicts["collective_dtypes"].figures["reductions_dtype_judged"] > 0
    assert verdicts["params_after_steps"].figures["steps_compared"] == spec.iterations
    state = verdicts["engine_state"].figures
    assert state["master_bytes"] >= state["master_bytes_needed"] > 0  # the fp32 masters are there, and measured


@pytest.mark.system
def test_a_wrapper_ignoring_grad_reduce_in_fp32_fails_collective_dtypes(pool):
    verdicts = _verdicts(pool, megatron_bf16_ignoring_grad_reduce_in_fp32)
    dtypes = verdicts["collective_dtypes"]
    assert not dtypes.ok and "rank 0: all_reduce #" in dtypes.message and "(iteration 1)" in dtypes.message \
        and "in bfloat16, the policy reduces in float32" in dtypes.message, dtypes.message
    assert "frozen_collectives" not in _failed(verdicts)


def test_grad_reduce_in_fp32_follows_the_reduce_dtype_and_refuses_the_rest():
    assert grad_reduce_in_fp32(SPEC) is True
    assert grad_reduce_in_fp32(SPEC.replace(dist=dataclasses.replace(SPEC.dist, reduce_dtype="bf16"))) is False
    assert grad_reduce_in_fp32(SPEC.replace(dist=dataclasses.replace(SPEC.dist, param_dtype="", reduce_dtype=""))) \
        is False  # no policy: Megatron's default
    with pytest.raises(WrapperError, match="dist.reduce_dtype=''"):
        grad_reduce_in_fp32(SPEC.replace(dist=dataclasses.replace(SPEC.dist, reduce_dtype="")))
    with pytest.raises(WrapperError, match="te="):
        grad_reduce_in_fp32(SPEC.replace(te=TEConfig(main_grad=True)))


def test_master_step_keeps_an_update_that_bf16_parameters_would_lose():
    """Megatron's step over fp32 masters: ten updates each below half a bf16 ulp of the parameter add up in the
    master and reach the bf16 parameter; stepping the bf16 parameter itself loses every one."""
    model = torch.ones(4, dtype=torch.bfloat16)
    grad = torch.full((4,), -1e-3, dtype=torch.float32)  # lr 0.1 x momentum: updates of 1e-4 .. 6e-4, ulp(1) 2^-7
    step = MasterStep([(model, grad)], sgd)
    for _ in range(10):
        step.step()
    assert step.masters[0].dtype == torch.float32 and float(model[0]) > 1.0
    assert float(step.masters[0][0]) == pytest.approx(1.0 + sum(0.1 * 1e-3 * sum(0.9 ** j for j in range(k + 1))
                                                                  for k in range(10)), rel=1e-6)
    assert torch.equal(model, step.masters[0].to(torch.bfloat16))  # copied back rounded to nearest
