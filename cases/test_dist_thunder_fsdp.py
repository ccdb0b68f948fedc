"""Distributed lane: thunder.distributed.fsdp(thunder.jit(model)), with frozen parameters; parity, gradient volume, reshard timing, peak."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import thunder_fsdp_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_thunder_fsdp"
LANE = "dist"


def test_dist_thunder_fsdp(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
