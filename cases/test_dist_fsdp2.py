"""Distributed lane: FSDP2 fully_shard on a CPU mesh (reshard_after_forward True/False), with frozen parameters; parity, gradient volume, reshard timing, peak."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import fsdp2_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_fsdp2"
LANE = "dist"


def test_dist_fsdp2(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
