"""Distributed lane: a wrapper's mixed-precision policy (FSDP2 MixedPrecisionPolicy, FSDP1 MixedPrecision: bf16
compute, fp32 reduction over fp32 parameters); gradients against the fp64 truth within the policy's bound, the dtype
of every collective (collective_dtypes), and the lane's other checks."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import mixed_precision_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_mixed_precision"
LANE = "dist"


def test_dist_mixed_precision(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
