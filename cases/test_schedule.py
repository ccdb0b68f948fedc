"""Freeze schedules: the trainable set changes between iterations; gradients, None-ness and parameters judged after
every change as after every step."""
from te_verify.matrix.stacks import schedule_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "schedule"
LANE = "torch"


def test_schedule(case):
    case.verify()
