"""FP8 parity: te_eager and thunder_te against fp32 eager (recipe tolerances: E4M3, or HYBRID's for E5M2
gradients), their gradients against the reference on the same FP8 operands within accumulation noise
(checks.fp8_tolerance), thunder_te also against te_eager; every row carries the TE lane's waste figures
(checks.te_waste).

Shapes FP8 GEMMs refuse (a width of 24): TE's modules refuse them at forward, with TE's own exception
(2.20: ValueError, older: AssertionError; the message says "divisible"); thunder's executor leaves those linears
to torch, which the tex record shows (no TE GEMM for them).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.checks.ending import ending
from te_verify.checks.leftovers import leftover_verdicts
from te_verify.checks.parity import grad_parity
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.te_waste import te_waste
from te_verify.checks.state import state_left_behind
from te_verify.checks.tolerances import tolerance_for
from te_verify.checks.verdict import Verdict
from te_verify.te.fp8 import fp8_dims_ok
from te_verify.probes import TE_COMPILE_BACKENDS
from te_verify.matrix.te import fp8_specs as SPECS  # noqa: F401
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.te_case import fp8_value_verdicts, output_reference, run_te, scaling_verdicts

FAMILY = "te_fp8"
LANE = "te"


def refused_layers(spec) -> set[str]:
    rows = 1
    for d in spec.batch_shape:
        rows *= d
    return {str(i) for i in range(spec.n_layers) if not (fp8_dims_ok((rows, spec.widths[i])) and fp8_dims_ok(
        (spec.widths[i + 1], spec.widths[i])))}


def _error_input_verdicts(case, got, ref) -> list[Verdict]:
    """te_eager refuses at forward in TE's words; thunder_te runs the refused linears outside TE."""
    spec, name = case.spec, case.backend_name
    if name == "te_eager" or name in TE_COMPILE_BACKENDS:  # TE's modules themselves, compiled or not
        ok = got.error is not None and got.error_pass == 0 and "divisible" in str(got.error)
        msg = "" if ok else f"[{spec.id}] te_eager: expected TE to refuse the FP8 shape at forward, got {got.error!r}"
        return [Verdict("fp8_shape_error", ok, msg)]
    refused = refused_layers(spec)
    claimed = set(got.figures.get("te_layers_claimed", []))
    ok = got.error is None and not (claimed & refused)
    msg = "" if ok else (f"[{spec.id}] {name}: expected layers {sorted(refused)} left to torch (FP8 refuses their "
                         f"shapes), got error={got.error!r}, TE GEMMs on layers {sorted(claimed)}")
    return [Verdict("fp8_shape_unclaimed", ok, msg), ending(spec.id, name, ref, got),
            grad_parity(spec.id, name, ref, got, tolerance_for(spec, name))]


def test_te_fp8(case):
    spec = case.spec
    skip_unsupported(case)
    ref = run_mean_reduced(spec, EagerBackend())
    if refused_layers(spec):
        got = run_te(case, follow=ref)
        skip = "FP8 refuses these widths: te_eager raises, thunder_te leaves the layers to torch"
        trains = case.backend_name not in ("te_eager", *TE_COMPILE_BACKENDS)  # TE raises at forward: no later iteration
        case.require(_error_input_verdicts(case, got, ref) + te_waste(spec.id, case.backend_name, spec, got, skip)
                     + leftover_verdicts(spec.id, case.backend_name, ref, got, second_step=trains)
                     + te_compile_verdicts(case, got))
        return
    tol = tolerance_for(spec, case.backend_name)
    quantized = output_reference(spec, backend=case.backend)
    got = run_te(case, follow=quantized)
    verdicts = [ending(spec.id, case.backend_name, ref, got),
                *fp8_value_verdicts(case, got, quantized),
                state_left_behind(spec.id, case.backend_name, ref, got, tol),
                *leftover_verdicts(spec.id, case.backend_name, ref, got),
                *te_waste(spec.id, case.backend_name, spec, got),
                *scaling_verdicts(case, got),
                *te_compile_verdicts(case, got)]
    if case.backend_name != "te_eager":
        te_eager = run_mean_reduced(spec, TEEagerBackend(), follow=quantized)
        vs_te = grad_parity(spec.id, case.backend_name, te_eager, got, tol)
        vs_te.check = "parity_vs_te_eager"
        vs_te.figures = {f"vs_te_eager_{k}": v for k, v in vs_te.figures.items()}
        verdicts.append(vs_te)
    case.require(verdicts)
