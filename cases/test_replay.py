"""Two and three backward passes over one graph with retain_graph=True (seed 001): end as eager ends."""
from te_verify.matrix.stacks import replay_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "replay"
LANE = "torch"


def test_replay(case):
    case.verify()
