"""Contract (seed 002): per module kind x config, what backward returns for a weight (wgrad / None / dummy),
main_grad accumulated exactly once per microbatch over 2 and 3 microbatches, no autograd accumulation copy; then the
optimizer steps on main_grad (Megatron's protocol) and the parameters after every step equal eager's. Each bias's
gradient is present or None as eager's (`grad_presence` over the biases: a weight's .grad is the contract's).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.checks.ending import ending
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.presence import grad_presence
from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix.te import contract_specs as SPECS  # noqa: F401
from te_verify.run.microbatch import run_microbatches
from te_verify.run.te_case import microbatch_waste_verdicts, output_reference, run_te

FAMILY = "te_contract"
LANE = "te"


def test_te_contract(case):
    spec = case.spec
    skip_unsupported(case)
    ref = run_microbatches(spec, EagerBackend())
    got = run_te(case, run_microbatches, follow=ref)
    tol = tolerance_for(spec, case.backend_name)
    case.require([ending(spec.id, case.backend_name, ref, got),
                  return_contract(spec.id, case.backend_name, spec, spec.te.module, ref, got, tol),
                  grad_presence(spec.id, case.backend_name, ref, got, suffix=".bias"),
                  output_parity(spec.id, case.backend_name, output_reference(spec, run_microbatches), got, tol),
                  params_after_steps(spec.id, case.backend_name, ref, got, tol),
                  state_left_behind(spec.id, case.backend_name, ref, got, tol),
                  *leftover_verdicts(spec.id, case.backend_name, ref, got, second_step=False),
                  *microbatch_waste_verdicts(case, got),
                  *te_compile_verdicts(case, got)])
