"""Weights and biases frozen independently, and stacks without bias."""
from te_verify.matrix.stacks import bias_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "bias"
LANE = "torch"


def test_bias(case):
    case.verify()
