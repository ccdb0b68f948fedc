"""Delayed wgrad: backward() then backward_dw() per microbatch, with frozen weights and over 1-3 calls,
equals the same backend without delay_wgrad_compute bitwise (TE's own delay-wgrad tests use rtol=atol=0),
and the contract holds (backward returns None; backward_dw accumulates into .grad, TE issue 3437).
Tied weights (TE issue 3437) are cases of this family; the reference's behaviour is in tests/test_te_delayed_wgrad.py.
"""
import dataclasses

from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.state import output_parity, state_left_behind
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import DTYPE_TOLERANCES, Tolerance
from te_verify.matrix_te import delayed_specs as SPECS  # noqa: F401
from te_verify.reference.microbatch import run_microbatches
from te_verify.te_case import run_te

FAMILY = "te_delayed"
LANE = "te"
BITWISE = Tolerance(0.0, 0.0, "TE tests/pytorch: delay_wgrad vs no delay compared with rtol=0, atol=0")
# A tied weight's wgrad is two layers' contributions: undelayed, autograd sums them before adding to .grad;
# delayed, each backward_dw adds its own. The contract leaves that order open and fp32 addition is not
# associative, so tied cases are held to the dtype table, not bitwise (TE's bitwise tests have no tied weights).
REASSOCIATED = DTYPE_TOLERANCES["fp32"]


def test_te_delayed(case):
    spec = case.spec
    got = run_te(case, run_microbatches)
    undelayed = spec.replace(te=dataclasses.replace(spec.te, delay_wgrad=False))
    ref = run_microbatches(undelayed, case.backend)
    grads = REASSOCIATED if spec.te.tied else BITWISE
    case.require([return_contract(spec.id, case.backend_name, spec, spec.te.module, ref, got, grads),
                  output_parity(spec.id, case.backend_name, ref, got, BITWISE),
                  state_left_behind(spec.id, case.backend_name, ref, got, BITWISE),
                  *leftover_verdicts(spec.id, case.backend_name, ref, got, second_step=False)])
