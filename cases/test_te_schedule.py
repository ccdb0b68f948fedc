"""Freeze schedules in the TE lane: the trainable set of a TE stack (TE Linear, te.ops' fused Linear; high precision,
FP8 delayed and current scaling) changes between iterations; gradients, None-ness, parameters (a newly frozen one
bitwise), FP8 scaling state and the tex record's GEMM work and saved bytes judged after every change as after every
step, against the oracle of the masks in force (checks.iterations)."""
from te_verify.matrix.te_schedule import te_schedule_specs as SPECS  # noqa: F401  (read by the plugin)
from te_verify.run.te_case import verify_te_stack

FAMILY = "te_schedule"
LANE = "te"


def test_te_schedule(case):
    verify_te_stack(case)
