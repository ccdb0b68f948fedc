"""Gradient accumulation on the torch lane (issue 34, item 5): 2-3 microbatches per iteration, each forward followed
by its backward or every forward first (several graphs alive at once, each layer called once per microbatch before
any backward); gradients after the first and the last microbatch, parameters after every step, None-ness, outputs
and every microbatch's GEMMs, against eager run in the same order (te_verify.run.accumulation)."""
from te_verify.matrix.stacks import accumulation_specs as SPECS  # noqa: F401  (read by the plugin)
from te_verify.run.accumulation import verify_accumulation

FAMILY = "accumulation"
LANE = "torch"


def test_accumulation(case):
    verify_accumulation(case)
