"""Every freeze mask of four square layers (seed 000's PEFT pattern among them): gradients and None-ness match eager."""
from te_verify.matrix.stacks import freeze_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "freeze"
LANE = "torch"


def test_freeze(case):
    case.verify()
