"""Delayed wgrad: backward() then backward_dw() per microbatch, with frozen weights and over 1-3 calls,
equals the same backend without delay_wgrad_compute bitwise (TE's own delay-wgrad tests use rtol=atol=0),
and the contract holds (backward returns None; backward_dw accumulates into .grad, TE issue 3437). The gradients
are also held to eager's (FP8 cases to the reference on the same FP8 operands, as te_fp8's), since a wgrad wrong the
same way with and without delay passes the bitwise comparison: `grad_parity` after the first microbatch (each wgrad
is right) and, over 2-3 microbatches, `grad_accumulation` after the last (they add up as eager's do), in every
training iteration, and `params_after_steps` after every optimizer step. Later microbatches reuse the FP8 weight copy
of the first (TE's is_first_microbatch, as Megatron passes it), and an optimizer step must refresh it.
Every parameter's gradient is present or None as eager's (`grad_presence`): backward_dw must not give a frozen bias
one (issue 34, item 4).
Tied weights (TE issue 3437) are cases of this family; the reference's behaviour is in tests/test_te_delayed_wgrad.py.
"""
import dataclasses

from te_verify.backends.eager import EagerBackend
from te_verify.checks.ending import ending
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.backends.te_eager import skip_unsupported
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.systematic import grad_scale
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import DTYPE_TOLERANCES, Tolerance, tolerance_for
from te_verify.matrix.te import delayed_specs as SPECS  # noqa: F401
from te_verify.run.microbatch import run_microbatches
from te_verify.run.te_case import (bf16_resolution, fp8_judged_against, high_precision_bound, microbatch_waste_verdicts,
                                   output_reference, run_te, scaling_verdicts)

FAMILY = "te_delayed"
LANE = "te"
BITWISE = Tolerance(0.0, 0.0, "TE tests/pytorch: delay_wgrad vs no delay compared with rtol=0, atol=0")
# A tied weight's wgrad is two layers' contributions: undelayed, autograd sums them before adding to .grad;
# delayed, each backward_dw adds its own. The contract leaves that order open and fp32 addition is not
# associative, so tied cases are held to the dtype table, not bitwise (TE's bitwise tests have no tied weights).
REASSOCIATED = DTYPE_TOLERANCES["fp32"]
# The gradient checks after the last microbatch (and every later iteration), by the name of the check after the first.
ACCUMULATED = {"grad_parity": "grad_accumulation", "grad_scale": "grad_scale_accumulation"}


def test_te_delayed(case):
    spec = case.spec
    skip_unsupported(case)
    eager = run_microbatches(spec, EagerBackend())
    quantized = output_reference(spec, run_microbatches, backend=case.backend) if spec.te.recipe else None
    judged = quantized or eager  # every run of the case starts each later iteration from its parameters
    undelayed = spec.replace(te=dataclasses.replace(spec.te, delay_wgrad=False))
    ref = run_microbatches(undelayed, case.backend, follow=judged)
    got = run_te(case, run_microbatches, follow=judged)
    grads = REASSOCIATED if spec.te.tied else BITWISE
    case.require([ending(spec.id, case.backend_name, judged, got),
                  return_contract(spec.id, case.backend_name, spec, spec.te.module, ref, got, grads),
                  *vs_eager(case, got, eager, quantized),
                  grad_presence(spec.id, case.backend_name, eager, got),
                  output_parity(spec.id, case.backend_name, ref, got, BITWISE),
                  state_left_behind(spec.id, case.backend_name, ref, got, BITWISE),
                  *leftover_verdicts(spec.id, case.backend_name, ref, got, second_step=False),
                  *microbatch_waste_verdicts(case, got),
                  *scaling_verdicts(case, got),
                  *te_compile_verdicts(case, got)])


def vs_eager(case, got, eager, quantized) -> list:
    """grad_parity and grad_scale after the first microbatch and, over 2-3 microbatches, grad_accumulation and
    grad_scale_accumulation after the last, each iteration's; the parameters after every optimizer step
    (params_after_steps); high precision against the case's fp64 truth (te_case.high_precision_bound: the dtype
    table's elementwise rtol fails a correct bf16 wgrad on its near-cancelling elements), FP8 against the reference
    on the same FP8 operands (te_case.fp8_judged_against)."""
    spec, name = case.spec, case.backend_name
    if quantized is None:  # against the fp64 truth, as te_peft's high-precision stacks (te_case.high_precision_bound)
        ref, tol, bound = eager, tolerance_for(spec, name), high_precision_bound(spec, eager, run_microbatches)
    else:
        ref, tol, bound = fp8_judged_against(case, got, quantized, run_microbatches)
    several = spec.te.microbatches > 1
    grads = lambda k: [grad_parity(spec.id, name, ref, got, tol, k, bound),
                       grad_scale(spec.id, name, ref, got, bound, k)]
    verdicts = grads(0 if several else -1) + [params_after_steps(spec.id, name, ref, got, tol, bound)]
    verdicts += bf16_resolution(spec, name, ref, got, verdicts[1])  # the first microbatch's grad_scale
    if several and len(got.grads) > 1:
        verdicts += [dataclasses.replace(v, check=ACCUMULATED[v.check]) for v in grads(-1)]
    return verdicts
