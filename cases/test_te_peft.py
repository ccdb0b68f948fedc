"""PEFT (seed 000): every freeze pattern through the TE backends. The tex record (GEMMs measured below TE's
Python) shows no wgrad GEMM for frozen weights and no dgrad where nothing upstream needs it; the saved FP8
copies are exactly the ones those GEMMs read; FLOPs and saved bytes equal the oracle's (checks.te_waste).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.te_waste import te_waste
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix_te import peft_specs as SPECS  # noqa: F401
from te_verify.reference.microbatch import run_mean_reduced
from te_verify.te_case import output_reference, run_te

FAMILY = "te_peft"
LANE = "te"


def test_te_peft(case):
    spec = case.spec
    got = run_te(case)
    ref = run_mean_reduced(spec, EagerBackend())
    tol = tolerance_for(spec, case.backend_name)
    case.require([output_parity(spec.id, case.backend_name, output_reference(spec), got, tol),
                  grad_presence(spec.id, case.backend_name, ref, got),
                  grad_parity(spec.id, case.backend_name, ref, got, tol),
                  state_left_behind(spec.id, case.backend_name, ref, got, tol),
                  *te_waste(spec.id, case.backend_name, spec, got)])
