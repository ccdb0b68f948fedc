"""Distributed lane, training engines: Megatron-core DDP with bf16 parameters (Float16Module) and fp32 masters (Megatron's
mixed-precision step), grad_reduce_in_fp32 True and False, over fp32 parameters; gradients and parameters after every
step against the fp64 truth within the policy's bound, the dtype of every collective (collective_dtypes), the lane's
other checks."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import megatron_policy_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_megatron_bf16"
LANE = "dist"


def test_dist_megatron_bf16(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
