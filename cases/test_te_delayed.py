"""Delayed wgrad: backward() then backward_dw() per microbatch, with frozen weights and over 1-3 calls,
equals the same backend without delay_wgrad_compute bitwise (TE's own delay-wgrad tests use rtol=atol=0),
and the contract holds (backward returns None; backward_dw accumulates into .grad, TE issue 3437).
Tied weights are covered in tests/test_te_delayed_wgrad.py.
"""
import dataclasses

from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import Tolerance
from te_verify.matrix_te import delayed_specs as SPECS  # noqa: F401
from te_verify.reference.microbatch import run_microbatches

FAMILY = "te_delayed"
LANE = "te"
BITWISE = Tolerance(0.0, 0.0, "TE tests/pytorch: delay_wgrad vs no delay compared with rtol=0, atol=0")


def test_te_delayed(case):
    skip_unsupported(case)
    spec = case.spec
    undelayed = spec.replace(te=dataclasses.replace(spec.te, delay_wgrad=False))
    ref = run_microbatches(undelayed, case.backend)
    got = run_microbatches(spec, case.backend)
    case.require([return_contract(spec.id, case.backend_name, spec, spec.te.module, ref, got, BITWISE)])
