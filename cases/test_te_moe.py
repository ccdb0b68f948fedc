"""MoE PEFT: a TE GroupedLinear of 4 experts with a subset frozen. Each expert is its own site (oracle.sites):
the tex record must show no wgrad GEMM for a frozen expert and the FP8 copies kept must be the ones the required
GEMMs read; gradients match eager's (frozen experts' .grad stays None).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.te_waste import te_waste
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix_te import moe_specs as SPECS  # noqa: F401
from te_verify.reference.microbatch import run_mean_reduced
from te_verify.te_case import output_reference, run_te

FAMILY = "te_moe"
LANE = "te"


def test_te_moe(case):
    spec = case.spec
    got = run_te(case)
    ref = run_mean_reduced(spec, EagerBackend())
    tol = tolerance_for(spec, case.backend_name)
    case.require([output_parity(spec.id, case.backend_name, output_reference(spec), got, tol),
                  grad_presence(spec.id, case.backend_name, ref, got),
                  grad_parity(spec.id, case.backend_name, ref, got, tol),
                  state_left_behind(spec.id, case.backend_name, ref, got, tol),
                  *te_waste(spec.id, case.backend_name, spec, got)])
