"""Freezing before versus after the backend prepares the model, and unfreezing after (a PEFT schedule step)."""
from te_verify.matrix.stacks import timing_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "timing"
LANE = "torch"


def test_timing(case):
    case.verify()
