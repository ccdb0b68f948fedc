"""PEFT (seed 000): every freeze pattern through the TE backends; the reference GEMM log shows no wgrad for
frozen weights, no dgrad where nothing upstream needs it, and FP8 copies saved only for the GEMMs that run;
FLOPs and saved-for-backward bytes equal the oracle's (checks.gemm_log.te_waste; figures on every row).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.gemm_log import saved_copies, te_waste
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix_te import peft_specs as SPECS  # noqa: F401
from te_verify.probes import default_probes
from te_verify.reference.microbatch import run_mean_reduced

FAMILY = "te_peft"
LANE = "te"


def test_te_peft(case):
    skip_unsupported(case)
    spec = case.spec
    ref = run_mean_reduced(spec, EagerBackend())
    got = run_mean_reduced(spec, case.backend, default_probes(case.backend_name))
    case.figures.update(got.figures)
    verdicts = [grad_presence(spec.id, case.backend_name, ref, got),
                grad_parity(spec.id, case.backend_name, ref, got, tolerance_for(spec, case.backend_name)),
                *te_waste(spec.id, case.backend_name, spec, got)]
    if case.backend.impl.is_reference_runtime:  # the GEMM log exists only on the reference runtime
        verdicts.append(saved_copies(spec.id, case.backend_name, spec, got))
    case.require(verdicts)
