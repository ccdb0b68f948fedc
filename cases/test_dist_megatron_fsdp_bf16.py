"""Distributed lane, training engines: Megatron-FSDP with bf16 parameters and fp32 main weights and main grads
(MixedPrecisionPolicy), gradient reductions in fp32 and bf16 (grad_comm_dtype), over fp32 parameters; gradients and
parameters after every step against the fp64 truth within the policy's bound, the dtype of every collective
(collective_dtypes), the lane's other checks."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import megatron_fsdp_policy_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_megatron_fsdp_bf16"
LANE = "dist"


def test_dist_megatron_fsdp_bf16(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
