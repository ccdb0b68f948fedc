"""Llama blocks with frozen stages (first blocks, embedding, head, norms): gradients and per-site work match eager's."""
from te_verify.matrix.models import stage_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "stages"
LANE = "torch"


def test_stages(case):
    case.verify()
