"""FP8 parity: te_eager and thunder_te against fp32 eager (recipe tolerances: E4M3, or HYBRID's for E5M2 gradients),
and thunder_te against te_eager; every row carries the TE lane's waste figures (checks.gemm_log.te_waste).

thunder_te vs te_eager on the reference: bitwise (rtol=atol=0). Both quantize the same operands with the
same scales (same scaler sequence per layer) and run the same fp32 GEMMs in the same order, so any
difference is a fault. With real TE the two paths use different TE entry points, so E4M3 tolerances apply.
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.checks.gemm_log import te_waste
from te_verify.checks.parity import grad_parity
from te_verify.checks.replay import replay_semantics
from te_verify.checks.tolerances import Tolerance, tolerance_for
from te_verify.checks.verdict import Verdict
from te_verify.matrix_te import fp8_specs as SPECS  # noqa: F401
from te_verify.probes import default_probes
from te_verify.reference.fp8 import fp8_dims_ok
from te_verify.reference.microbatch import run_mean_reduced

FAMILY = "te_fp8"
LANE = "te"
BITWISE = Tolerance(0.0, 0.0, "same quantized operands and fp32 GEMMs in the same order (reference runtime)")


def _error_input_verdicts(case, got, ref) -> list[Verdict]:
    """Widths FP8 GEMMs refuse: TE modules raise AssertionError; thunder's executor leaves those linears to torch."""
    if case.backend_name == "te_eager":
        ok = isinstance(got.error, AssertionError) and got.error_pass == 0 and "divisible" in str(got.error)
        msg = "" if ok else f"[{case.spec.id}] te_eager: expected AssertionError at forward for width 24, got {got.error!r}"
        return [Verdict("fp8_shape_error", ok, msg)]
    spec = case.spec
    refused = {str(i) for i in range(spec.n_layers) if not fp8_dims_ok((spec.batch_shape[0], spec.widths[i]))}
    claimed = {e.layer for e in got.observations.get("gemm_log", [])}
    ok = got.error is None and not (claimed & refused)
    msg = "" if ok else (f"[{spec.id}] thunder_te: expected layers {sorted(refused)} left to torch (FP8 refuses their "
                         f"shapes), got error={got.error!r}, reference GEMMs on layers {sorted(claimed)}")
    return [Verdict("fp8_shape_unclaimed", ok, msg),
            grad_parity(spec.id, case.backend_name, ref, got, tolerance_for(spec, case.backend_name))]


def test_te_fp8(case):
    skip_unsupported(case)
    spec = case.spec
    ref = run_mean_reduced(spec, EagerBackend())
    got = run_mean_reduced(spec, case.backend, default_probes(case.backend_name))
    case.figures.update(got.figures)
    if not fp8_dims_ok((spec.batch_shape[0], min(spec.widths))):
        skip = "FP8 refuses these widths: te_eager raises, thunder_te leaves the layers to torch in fp32"
        case.require(_error_input_verdicts(case, got, ref) + te_waste(spec.id, case.backend_name, spec, got, skip))
        return
    tol = tolerance_for(spec, case.backend_name)
    verdicts = [replay_semantics(spec.id, case.backend_name, ref, got, tol),
                grad_parity(spec.id, case.backend_name, ref, got, tol),
                *te_waste(spec.id, case.backend_name, spec, got)]
    if case.backend_name != "te_eager":
        te_ref = run_mean_reduced(spec, TEEagerBackend())
        tight = BITWISE if case.backend.impl.is_reference_runtime else tol
        tight_verdict = grad_parity(spec.id, case.backend_name, te_ref, got, tight)
        tight_verdict.check = "parity_vs_te_eager"
        tight_verdict.figures = {f"vs_te_eager_{k}": v for k, v in tight_verdict.figures.items()}
        verdicts.append(tight_verdict)
    case.require(verdicts)
