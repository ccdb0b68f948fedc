"""Replays (seed 001): k backward passes with retain_graph=True over one forward.

te_eager and torch_compile_te (TE's modules, eager or compiled) are held to fp32 eager, which completes every pass:
real TE frees its saved state in the first backward and raises in the second (TE issue 990), so those cases are
recorded known gaps, and the row keeps the class and message TE raised. thunder_te is held to te_eager: it must end
the same way (same exception class at the same pass, or equal gradients after every pass); its maintainers asked for
exactly that (thunder issue 701). Every row carries the waste figures (checks.te_waste): each replay repeats exactly
the required backward GEMMs. The gradients of the last pass both runs completed are also the grad_parity check's
(beside a replay gap, a wrong first pass still fails). FP8 replays and gradients are held to the reference on the
same FP8 operands (checks.fp8_tolerance), not TE's dtype table.
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.checks.ending import ending
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.parity import grad_parity
from te_verify.checks.replay import replay_semantics
from te_verify.checks.systematic import grad_scale
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.te_waste import te_waste
from te_verify.checks.state import output_parity, params_after_steps, state_left_behind
from te_verify.checks.tolerances import tolerance_for
from te_verify.matrix.te import replay_specs as SPECS  # noqa: F401
from te_verify.probes import TE_COMPILE_BACKENDS
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.te_case import (bf16_resolution, fp8_value_verdicts, high_precision_bound, output_reference, run_te,
                                   scaling_verdicts)

FAMILY = "te_replay"
LANE = "te"


def test_te_replay(case):
    spec = case.spec
    skip_unsupported(case)
    te_modules = case.backend_name in ("te_eager", *TE_COMPILE_BACKENDS)  # TE's modules, eager or compiled
    ref = run_mean_reduced(spec, EagerBackend() if te_modules else TEEagerBackend())
    quantized = output_reference(spec, backend=case.backend)
    outputs_ref = quantized if te_modules else ref
    tol = tolerance_for(spec, case.backend_name)
    got = run_te(case, follow=quantized if spec.te.recipe else ref)
    # High precision: outputs, gradients and parameters against the fp64 truth too (within a factor of eager's error,
    # as verify_te_stack judges them): another bf16 accumulation order over the replays is not a fault.
    bound = high_precision_bound(spec, ref) if spec.te.recipe is None else None
    scale = grad_scale(spec.id, case.backend_name, ref, got, bound) if bound is not None else None
    values = (fp8_value_verdicts(case, got, quantized, outputs=False) if spec.te.recipe
              else [replay_semantics(spec.id, case.backend_name, ref, got, tol),
                    grad_parity(spec.id, case.backend_name, ref, got, tol, bound=bound),
                    scale, *bf16_resolution(spec, case.backend_name, ref, got, scale),
                    params_after_steps(spec.id, case.backend_name, ref, got, tol, bound)])
    case.require([ending(spec.id, case.backend_name, ref, got),
                  output_parity(spec.id, case.backend_name, outputs_ref, got, tol, bound),
                  state_left_behind(spec.id, case.backend_name, ref, got, tol),
                  *values,
                  *leftover_verdicts(spec.id, case.backend_name, ref, got),
                  *te_waste(spec.id, case.backend_name, spec, got),
                  *scaling_verdicts(case, got),
                  *te_compile_verdicts(case, got)])
