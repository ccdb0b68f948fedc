"""MoE PEFT: a TE GroupedLinear of 4 experts with a subset frozen. Each expert is its own site (oracle.sites):
the tex record must show no wgrad GEMM for a frozen expert and the FP8 copies kept must be the ones the required
GEMMs read; gradients match eager's (frozen experts' .grad stays None).
"""
from te_verify.matrix.te import moe_specs as SPECS  # noqa: F401
from te_verify.run.te_case import verify_te_stack

FAMILY = "te_moe"
LANE = "te"


def test_te_moe(case):
    verify_te_stack(case)
