"""TE Linears under torch.autocast(bf16) over fp32 parameters, with and without an FP8 recipe: the tex record's
GEMMs and saved copies against the oracle, gradients against the fp64 truth within bounds derived from bf16."""
from te_verify.matrix.autocast import te_autocast_specs as SPECS  # noqa: F401  (read by the plugin)
from te_verify.run.te_case import verify_te_stack

FAMILY = "te_autocast"
LANE = "te"


def test_te_autocast(case):
    verify_te_stack(case)
