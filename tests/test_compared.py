"""No verdict from nothing: every check says in the row how much it compared, and a check that could compare
nothing where the case has something to compare fails saying so (never a pass)."""
import pytest
import torch

from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.parity import grad_parity
from te_verify.checks.presence import grad_presence
from te_verify.checks.state import params_after_steps
from te_verify.checks.tolerances import DTYPE_TOLERANCES
from te_verify.checks.verdict import CheckFailures
from te_verify.record import Record, TensorState
from te_verify.spec import CaseSpec, ModelConfig, TEConfig
from te_verify.run.te_case import verify_te_stack

ALT = (True, False, True, False)
STACK = CaseSpec("freeze", (32, 64, 128, 64, 32), ALT, ALT, True, (8,))
FAMILY = CaseSpec("lora", (32, 32), (), None, True, (2, 8), model=ModelConfig(lora_on=("q", "v")))
TE_FP8 = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, True, (16,), te=TEConfig(recipe="delayed"))
# Figures a row keeps beside verdicts that judge nothing by design (docs/checks.md: a model family's peak is recorded
# beside eager's, with no structural bound).
FIGURE_ONLY = {("lora", "waste_peak")}


def _verdicts(run):
    try:
        return run()
    except CheckFailures as failure:
        return failure.verdicts


@pytest.mark.parametrize("spec", [STACK, FAMILY], ids=["stack", "family"])
def test_every_torch_lane_check_says_how_much_it_compared(spec):
    for v in _verdicts(lambda: CaseRun(spec, "eager", EagerBackend()).verify()):
        assert (spec.family, v.check) in FIGURE_ONLY or any("compared" in k for k in v.figures), (v.check, v.figures)


def test_every_te_lane_check_says_how_much_it_compared(te_python):
    for v in _verdicts(lambda: verify_te_stack(CaseRun(TE_FP8, "te_eager", TEEagerBackend()))):
        assert any("compared" in k for k in v.figures), (v.check, v.figures)


def _record(name: str, passes: int, trains: bool = True) -> Record:
    """A record as a run leaves it: `passes` backward passes completed, one parameter needing a gradient."""
    record = Record(name, requires_grad_after={"0.weight": trains})
    record.inputs_before["input x"] = TensorState.of(torch.zeros(2))
    record.grads = [{"0.weight": torch.ones(2)} for _ in range(passes)]
    return record


def test_a_reference_that_compared_nothing_fails_where_the_case_trains():
    """The issue's run after a leaked grad mode: eager and the backend both raised at backward pass 1, every gradient
    check compared 0 passes; that is a failure now, not a pass."""
    ref, got = _record("eager", 0), _record("clean", 0)
    for verdict in (grad_parity("c", "clean", ref, got, DTYPE_TOLERANCES["fp32"]), grad_presence("c", "clean", ref, got)):
        assert not verdict.ok and "not observed" in verdict.message, verdict
    frozen_ref, frozen_got = _record("eager", 0, trains=False), _record("clean", 0, trains=False)
    assert grad_parity("c", "clean", frozen_ref, frozen_got, DTYPE_TOLERANCES["fp32"]).ok  # nothing to train


def test_a_run_that_ended_early_is_not_observed_and_blocked_by_ending():
    ref, got = _record("eager", 1), _record("backend", 0)
    verdict = grad_parity("c", "backend", ref, got, DTYPE_TOLERANCES["fp32"])
    assert not verdict.ok and verdict.blocked_by == "ending" and "not observed" in verdict.message
    ref.steps = [object()]  # the reference took an optimizer step, the run none
    verdict = params_after_steps("c", "backend", ref, got, DTYPE_TOLERANCES["fp32"])
    assert not verdict.ok and verdict.blocked_by == "ending" and "took no optimizer step" in verdict.message
