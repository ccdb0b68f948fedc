"""PEFT (seed 000): every freeze pattern through the TE backends; the reference GEMM log shows no wgrad for
frozen weights, no dgrad where nothing upstream needs it, and FP8 copies saved only for the GEMMs that run.
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.gemm_log import gemm_work, saved_copies
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix_te import peft_specs as SPECS  # noqa: F401
from te_verify.reference.gemm_probe import GemmProbe
from te_verify.reference.microbatch import run_mean_reduced

FAMILY = "te_peft"
LANE = "te"


def test_te_peft(case):
    skip_unsupported(case)
    spec = case.spec
    ref = run_mean_reduced(spec, EagerBackend())
    got = run_mean_reduced(spec, case.backend, [GemmProbe()])
    case.figures.update(got.figures)
    verdicts = [grad_presence(spec.id, case.backend_name, ref, got),
                grad_parity(spec.id, case.backend_name, ref, got, tolerance_for(spec, case.backend_name))]
    if case.backend.impl.is_reference_runtime:  # the GEMM log exists only on the reference runtime
        verdicts += [gemm_work(spec.id, case.backend_name, spec, got), saved_copies(spec.id, case.backend_name, spec, got)]
    case.require(verdicts)
