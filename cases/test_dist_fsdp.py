"""Distributed lane: FSDP1 (use_orig_params=True; FULL_SHARD / SHARD_GRAD_OP / NO_SHARD), with frozen parameters; parity, gradient volume, reshard timing, peak."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import fsdp_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_fsdp"
LANE = "dist"


def test_dist_fsdp(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
