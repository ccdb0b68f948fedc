"""Distributed lane: freeze schedules after wrapping (the trainable set changes between iterations); every later
iteration's gradients on every rank against eager's (dist_schedule_parity), besides the measured step's checks."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import schedule_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_schedule"
LANE = "dist"


def test_dist_schedule(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
