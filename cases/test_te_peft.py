"""PEFT (seed 000): every freeze pattern through the TE backends. The tex record (GEMMs measured below TE's
Python) shows no wgrad GEMM for frozen weights and no dgrad where nothing upstream needs it; the saved FP8
copies are exactly the ones those GEMMs read; FLOPs and saved bytes equal the oracle's (checks.te_waste).
"""
from te_verify.matrix.te import peft_specs as SPECS  # noqa: F401
from te_verify.run.te_case import verify_te_stack

FAMILY = "te_peft"
LANE = "te"


def test_te_peft(case):
    verify_te_stack(case)
