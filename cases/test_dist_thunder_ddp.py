"""Distributed lane: thunder.distributed.ddp(thunder.jit(model)), with frozen parameters; parity, gradient volume, reshard timing, peak."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import thunder_ddp_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_thunder_ddp"
LANE = "dist"


def test_dist_thunder_ddp(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
