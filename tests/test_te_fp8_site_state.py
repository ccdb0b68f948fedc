"""fp8_scaling judges each delayed-scaling site (a GEMM's weight and operand role) across the run, not only each
scaling-state slot: a TE build whose layers get a new delayed-scaling state at iteration 2 (scale 1, empty amax
history, as thunder's TE executor after a recompile) passes every slot's own model but fails the site, named with
the iteration and both scales and histories; its clean twin passes; a layer whose backward first runs after an
unfreeze (its grad_output site's first quantization in iteration 2) is no restart."""
from __future__ import annotations

import pytest
from planted_te_schedule import QuantizesEveryCall, RestartsScalingState

from te_verify.checks.fp8_site_state import check_site_states
from te_verify.checks.verdict import CheckFailures
from te_verify.probes.fp8_scaling import DELAYED, Quantization
from te_verify.run.caserun import CaseRun
from te_verify.run.te_case import verify_te_stack
from te_verify.spec import CaseSpec, TEConfig

# Layer 0 frozen until iteration 2: its backward (grad_output quantized for its wgrad) first runs then.
UNFREEZE = CaseSpec("te_schedule", (16, 32, 16), (True, False), (True, False), False, (16,),
                    te=TEConfig(recipe="delayed"), schedule=((2, "unfreeze_all"),))


def _scaling(backend) -> object:
    case = CaseRun(UNFREEZE, "te_eager", backend)
    try:
        verify_te_stack(case)
    except CheckFailures:
        pass
    return next(v for v in case.verdicts if v.check == "fp8_scaling")


@pytest.mark.usefixtures("te_python")
def test_a_restarted_delayed_scaling_state_fails_naming_the_site_and_iteration():
    verdict = _scaling(RestartsScalingState())
    assert not verdict.ok
    restarts = [p for p in verdict.problems if "starts over" in p]
    assert len(restarts) == 5, verdict.problems  # input and weight of both layers, 1.weight's grad_output
    assert restarts[0].startswith("0.weight's input: from iteration 2 (forward call 2) quantized by a new "
                                  "delayed-scaling state that starts over (scale 1, amax history empty) where the "
                                  "recipe keeps the site's state: scale "), restarts[0]
    assert any(p.startswith("1.weight's grad_output: from iteration 2 (backward call 2)") for p in restarts)
    assert not any(p.startswith("0.weight's grad_output") for p in verdict.problems)  # first seen in iteration 2
    assert len(restarts) == len(verdict.problems)  # each new slot's own model is satisfied: only the site sees it


@pytest.mark.usefixtures("te_python")
def test_clean_twin_passes_and_a_backward_first_run_after_an_unfreeze_is_no_restart():
    verdict = _scaling(QuantizesEveryCall())
    assert verdict.ok, verdict.message
    assert verdict.figures["fp8_delayed_sites"] == 6  # 0.weight's grad_output from iteration 2 among them
    assert verdict.figures["fp8_delayed_quantizations_without_site"] == 0


def _q(slot: tuple, iteration: int, scale: float, site: str | None) -> Quantization:
    return Quantization(DELAYED, slot, ("forward", iteration), (iteration, iteration - 1), iteration, None, 1.0,
                        scale, 448.0, site)


class _Model:
    def __init__(self, scale: float, history: list[float]) -> None:
        self.scale, self.history = scale, history


def _problems(qs: list[Quantization], finals: dict) -> tuple[list[str], dict]:
    problems: list[str] = []
    return problems, check_site_states(qs, finals, lambda have, want: have == want, problems)


def test_slots_in_use_together_are_no_move_and_a_fresh_old_state_is_no_restart():
    tied = [_q((1, 0), 1, 1.0, "w's input"), _q((2, 0), 1, 1.0, "w's input"), _q((1, 0), 2, 8.0, "w's input"),
            _q((2, 0), 2, 8.0, "w's input")]
    assert _problems(tied, {(1, 0): _Model(8.0, [0.0, 56.0])})[0] == []  # a tied weight's two modules
    unused = [_q((1, 0), 1, 1.0, "w's input"), _q((2, 0), 2, 1.0, "w's input")]
    assert _problems(unused, {(1, 0): _Model(1.0, [0.0, 0.0])})[0] == []  # the old state never updated


def test_a_site_not_observed_is_said_in_the_figures():
    problems, figures = _problems([_q((1, 0), 1, 1.0, None), _q((2, 0), 2, 1.0, None)], {(1, 0): _Model(8.0, [56.0])})
    assert problems == [] and figures["fp8_delayed_quantizations_without_site"] == 2
    assert figures["fp8_site_states"].startswith("not observed: ")
