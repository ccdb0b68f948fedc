"""Replays (seed 001): thunder_te ends k backward passes with retain_graph=True exactly as te_eager does
(equal gradients after every pass, or the same exception class at the same pass); te_eager is compared
with fp32 eager the same way under the active --te-impl (the freeing variant makes te_eager raise). Every row
carries the waste figures (checks.gemm_log.te_waste): each replay repeats exactly the required backward GEMMs.
"""
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend, skip_unsupported
from te_verify.checks.gemm_log import te_waste
from te_verify.checks.replay import replay_semantics
from te_verify.checks.tolerances import Tolerance, tolerance_for
from te_verify.matrix_te import replay_specs as SPECS  # noqa: F401
from te_verify.probes import default_probes
from te_verify.reference.microbatch import run_mean_reduced

FAMILY = "te_replay"
LANE = "te"
SAME_RUNTIME = Tolerance(0.0, 0.0, "thunder_te and te_eager share the reference runtime: bitwise")


def test_te_replay(case):
    skip_unsupported(case)
    spec = case.spec
    got = run_mean_reduced(spec, case.backend, default_probes(case.backend_name))
    case.figures.update(got.figures)
    if case.backend_name == "te_eager":
        ref = run_mean_reduced(spec, EagerBackend())
        if case.backend.impl.api.FREE_SAVED_AFTER_BACKWARD:
            ref = got  # TE frees state by design (TE issue 990); the thunder_te case holds the compiled side to it
        verdict = replay_semantics(spec.id, case.backend_name, ref, got, tolerance_for(spec, case.backend_name))
    else:
        ref = run_mean_reduced(spec, TEEagerBackend())
        tol = SAME_RUNTIME if case.backend.impl.is_reference_runtime else tolerance_for(spec, case.backend_name)
        verdict = replay_semantics(spec.id, case.backend_name, ref, got, tol)
    case.require([verdict, *te_waste(spec.id, case.backend_name, spec, got)])
