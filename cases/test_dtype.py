"""bf16 parameters and inputs, with bf16 tolerances."""
from te_verify.matrix.stacks import dtype_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "dtype"
LANE = "torch"


def test_dtype(case):
    case.verify()
