"""Distributed lane: fairscale 0.4.13 FSDP (reshard_after_forward, flatten_parameters; CPU compat layer in the ranks), with frozen parameters; parity, gradient volume, reshard timing, peak."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import fairscale_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_fairscale"
LANE = "dist"


def test_dist_fairscale(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
