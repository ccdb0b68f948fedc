"""Depth 2-6, the non-square 32-64-128-64-32 stack, widths that are not multiples of 8/16, 2-D and 3-D inputs."""
from te_verify.matrix.stacks import shapes_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "shapes"
LANE = "torch"


def test_shapes(case):
    case.verify()
