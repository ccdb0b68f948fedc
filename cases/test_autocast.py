"""Mixed precision: fp32 parameters under torch.autocast(bf16) in every forward, eager's too; gradients against the
fp64 truth within bounds derived from bf16, and no cast copy of a weight saved beyond what dgrad needs."""
from te_verify.matrix.autocast import autocast_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "autocast"
LANE = "torch"


def test_autocast(case):
    case.verify()
