"""The TE lane's checks against TE's real Python (over the tex emulation): what upstream does is caught with a
message naming the layer, a planted fix passes the same checks, and the reference's planted contract faults are
caught. Each known gap shown here is also a recorded expectation (expectations/*.toml)."""
import pytest

from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.backends.thunder_te import ThunderTEBackend
from te_verify.checks.fp8_copies import fp8_copies
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.ending import ending
from te_verify.checks.replay import replay_semantics
from te_verify.checks.te_waste import gemm_work
from te_verify.checks.tolerances import tolerance_for
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec, TEConfig
from planted_thunder_te import FixedThunderTE

ALT = (True, False, True, False)
PEFT = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, True, (16,), te=TEConfig(recipe="delayed"))
REPLAY = CaseSpec("te_replay", (32, 64, 32), (False, False), (False, False), True, (16,), replays=2,
                  te=TEConfig(recipe="delayed"))


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _run(spec, backend):
    return run_mean_reduced(spec, backend, default_probes("thunder_te" if "thunder" in backend.name else backend.name))


def test_te_modules_run_exactly_the_required_gemms():
    got = _run(PEFT, TEEagerBackend())
    verdict = gemm_work(PEFT.id, "te_eager", PEFT, got)
    assert verdict.ok, verdict.message


def test_thunder_te_computes_wgrad_for_frozen_weights_and_keeps_their_input_copies():
    """thunder issue 2076, on thunder 0.2.6's own executor."""
    got = _run(PEFT, ThunderTEBackend())
    work, copies = gemm_work(PEFT.id, "thunder_te", PEFT, got), fp8_copies(PEFT.id, "thunder_te", PEFT, got)
    assert "layer 0 (frozen weight): 1 wgrad GEMM, 0 required" in work.message
    assert "layer 2 (frozen weight): 1 wgrad GEMM, 0 required" in work.message
    assert "layer 2 (wgrad not needed): saved input FP8 copy" in copies.message


def test_planted_fixed_executor_passes_the_peft_checks():
    """thunder PR 2138's idea (tell TE which gradients are needed) is what the checks ask for."""
    got = _run(PEFT, FixedThunderTE())
    ref = run_mean_reduced(PEFT, EagerBackend())
    verdicts = [gemm_work(PEFT.id, "thunder_te", PEFT, got), fp8_copies(PEFT.id, "thunder_te", PEFT, got),
                grad_parity(PEFT.id, "thunder_te", ref, got, tolerance_for(PEFT))]
    assert all(v.ok for v in verdicts), [v.message for v in verdicts]


def test_flags_from_trace_requires_grad_alone_lose_trainable_gradients():
    """The reverted PR 1838 (thunder issue 1966): intermediate proxies' requires_grad is unreliable (issue 1768)."""
    spec = PEFT.replace(input_requires_grad=False)
    got = _run(spec, FixedThunderTE(propagate=False))
    verdict = grad_presence(spec.id, "thunder_te", run_mean_reduced(spec, EagerBackend()), got)
    assert not verdict.ok and "1.weight: gradient is None after pass 1, expected a gradient" in verdict.message


def test_te_raises_at_the_second_backward_where_thunder_te_completes():
    """TE issue 990 (TE frees ctx state) against thunder issue 701 (thunder should end the same way)."""
    te = _run(REPLAY, TEEagerBackend())
    assert type(te.error).__name__ == "AttributeError" and te.error_pass == 2, te.error
    thunder = _run(REPLAY, ThunderTEBackend())
    verdict = ending(REPLAY.id, "thunder_te", te, thunder)  # how each run ended is the `ending` check's
    assert thunder.error is None and not verdict.ok
    assert "completed 2 backward pass(es) and 3 iterations, but te_eager raised AttributeError at backward pass 2" in verdict.message
    assert "its 2nd pass added gradients" in verdict.message
    assert replay_semantics(REPLAY.id, "thunder_te", te, thunder, tolerance_for(REPLAY)).figures["replay_drift"] > 0


@pytest.mark.system
def test_an_unemulated_tex_call_makes_its_case_error_naming_the_function_and_tes_call_site():
    from test_plugin import run_pytest

    proc = run_pytest("cases/test_te_peft.py", "--tier", "smoke", "--backend",
                      "planted_te_backends:UserbuffersLinearTE", "-k", "freeze1010", "-W", "ignore")
    out = proc.stdout
    assert proc.returncode == 1 and " 1 failed" in out and "passed" not in out.splitlines()[-1], out[-2000:]
    assert ("Unemulated: transformer_engine_torch.device_supports_multicast is not emulated on CPU "
            "(te_verify.te.tecpu)") in out
    assert "called from transformer_engine/pytorch/module/base.py:" in out
    assert "in initialize_ub" in out
