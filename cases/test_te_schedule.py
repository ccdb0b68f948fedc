"""Freeze schedules in the TE lane: the trainable set of a TE stack (TE Linear, te.ops' fused Linear; high precision,
FP8 delayed and current scaling) changes between iterations; gradients, None-ness, parameters (a newly frozen one
bitwise), FP8 scaling state and the tex record's GEMM work and saved bytes judged after every change as after every
step, against the oracle of the masks in force (checks.iterations)."""
import pytest

from te_verify.matrix.te_schedule import te_schedule_specs as SPECS  # noqa: F401  (read by the plugin)
from te_verify.run.te_case import verify_te_stack

FAMILY = "te_schedule"
LANE = "te"
# The backends whose schedule cases have been run and their gaps recorded; the compiled TE backends (thunder_te,
# torch_compile_te) skip saying so until they are (docs/training.md, "Freeze schedules in the TE lane").
MEASURED = ("te_eager",)


def test_te_schedule(case):
    if case.backend_name not in MEASURED:
        pytest.skip(f"te_schedule on {case.backend_name}: not measured yet (issue 34, item 3: only {MEASURED} so far)")
    verify_te_stack(case)
