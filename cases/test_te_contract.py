"""Contract (seed 002): per module kind x config, what backward returns for a weight (wgrad / None / dummy),
main_grad accumulated exactly once per microbatch over 2 and 3 microbatches, no autograd accumulation copy.
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix_te import contract_specs as SPECS  # noqa: F401
from te_verify.reference.microbatch import run_microbatches

FAMILY = "te_contract"
LANE = "te"


def test_te_contract(case):
    skip_unsupported(case)
    spec = case.spec
    ref = run_microbatches(spec, EagerBackend())
    got = run_microbatches(spec, case.backend)
    case.require([return_contract(spec.id, case.backend_name, spec, spec.te.module, ref, got,
                                  tolerance_for(spec, case.backend_name))])
