"""Distributed lane, training engines: DeepSpeed ZeRO 1-3 under its bf16 section (bf16 parameters, fp32 masters;
grad_accum_dtype fp32 and the default; the reduction's communication dtype) over fp32 parameters; gradients against
the fp64 truth within the policy's bound, the dtype of every collective (collective_dtypes), the lane's other checks."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import deepspeed_policy_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_deepspeed_bf16"
LANE = "dist"


def test_dist_deepspeed_bf16(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
