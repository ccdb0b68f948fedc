"""DeepSpeed's bf16 section as a mixed-precision policy (engines.deepspeed_bf16): deepspeedai/DeepSpeed#7985's order
(the last microbatch's gradient never averaged over ranks) fails dist_grad_parity naming the gradients; a reduction
in bf16 where the policy says fp32 fails collective_dtypes; the engine as configured (0.19.8) passes every check."""
from __future__ import annotations

import pytest

from planted_deepspeed_bf16 import (zero1_bf16_as_specified, zero1_bf16_last_microbatch_unreduced,
                                    zero1_bf16_reduce_in_bf16)
from te_verify.distributed.pool.pool import RankPool
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import deepspeed_policy_specs

pytest.importorskip("deepspeed")
SPEC = deepspeed_policy_specs("smoke")[0]  # ZeRO-1, grad_accum_dtype fp32, two microbatches, fp32 reduction


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(world_size=2, case_timeout_s=120.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap) -> dict:
    return {v.check: v for v in verify_dist(SPEC, pool, {}, wrap=wrap)}


def test_the_bf16_optimizer_as_configured_passes(pool):
    verdicts = _verdicts(pool, zero1_bf16_as_specified)
    failed = {name: v.message for name, v in verdicts.items() if not v.ok}
    assert not failed, failed
    assert verdicts["collective_dtypes"].figures["reductions_dtype_judged"] > 0


def test_the_last_microbatch_left_unreduced_fails_grad_parity(pool):
    verdicts = _verdicts(pool, zero1_bf16_last_microbatch_unreduced)
    parity = verdicts["dist_grad_parity"]
    assert not parity.ok and "grad of 3.weight: error vs the fp64 truth" in parity.message, parity.message
    assert "frozen" not in parity.message and verdicts["collective_dtypes"].ok


def test_a_bf16_reduction_where_the_policy_says_fp32_fails_collective_dtypes(pool):
    verdicts = _verdicts(pool, zero1_bf16_reduce_in_bf16)
    dtypes = verdicts["collective_dtypes"]
    assert not dtypes.ok and "in bfloat16, the policy reduces in float32" in dtypes.message, dtypes.message
