"""Freeze schedules (issue 34, item 3): the spec field, the masks per iteration, and the checks after a change: a
callable built for the old requires_grad flags and reused after an unfreeze is caught naming the
parameter and the iteration; its clean twin, written differently from eager, passes. (A parameter frozen later
cannot get a gradient from the stale callable: autograd reads requires_grad on the leaf itself.)"""
from __future__ import annotations

import pytest

from planted_schedule import RereadsRequiresGrad, StaleRequiresGrad
from te_verify.checks.verdict import CheckFailures
from te_verify.models import masks_at, new_state_bytes
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec, SpecError

BASE = CaseSpec("freeze", (8, 16, 16, 8), (True, True, False), (True, True, False))
UNFREEZE = BASE.replace(schedule=((2, "unfreeze_all"),))
FREEZE = BASE.replace(weight_frozen=(False,) * 3, bias_frozen=(False,) * 3, schedule=((2, "freeze_all_but_last"),))


def _failure(spec: CaseSpec, backend) -> str:
    with pytest.raises(CheckFailures) as info:
        CaseRun(spec, backend.name, backend).verify()
    return str(info.value)


def test_spec_id_suffix_only_off_default_and_round_trip():
    assert "sched" not in BASE.id
    assert UNFREEZE.id == BASE.id + "-sched2.unfreeze_all"
    two = BASE.replace(schedule=((2, "swap"), (3, "bias_only")))
    assert two.id.endswith("-sched2.swap+3.bias_only")
    assert CaseSpec.from_dict(two.to_dict()) == two


@pytest.mark.parametrize("schedule, names", [
    (((1, "unfreeze_all"),), "in 2..3"), (((4, "unfreeze_all"),), "in 2..3"),
    (((3, "swap"), (2, "swap")), "ascending"), (((2, "melt"),), "changes from"), ((("2", "swap"),), "pairs"),
])
def test_spec_rejects_bad_schedules_naming_the_field(schedule, names):
    with pytest.raises(SpecError, match=r"^schedule=.*" + names):
        BASE.replace(schedule=schedule)


def test_spec_rejects_bias_only_without_biases():
    with pytest.raises(SpecError, match="'bias_only' needs biases"):
        BASE.replace(bias_frozen=None, schedule=((2, "bias_only"),))


def test_masks_per_iteration_fold_the_changes():
    spec = BASE.replace(schedule=((2, "swap"), (3, "bias_only")))
    assert masks_at(spec, 1) == ((True, True, False), (True, True, False))
    assert masks_at(spec, 2) == ((False, False, True), (False, False, True))
    assert masks_at(spec, 3) == ((True, True, True), (False, False, False))
    assert masks_at(UNFREEZE.replace(freeze_timing="unfreeze_after"), 1) == ((False,) * 3, (False,) * 3)
    # iteration 2's step makes momentum for layers 0 and 1 (weights 8x16, 16x16; biases 16, 16), fp32
    assert new_state_bytes(UNFREEZE, 2) == 4 * (8 * 16 + 16 * 16 + 16 + 16)
    assert new_state_bytes(spec, 3) == 0  # every bias trained before


def test_callable_reused_after_an_unfreeze_misses_the_new_gradients():
    message = _failure(UNFREEZE, StaleRequiresGrad())
    assert "0.weight: gradient is None after iteration 2, expected a gradient (trainable)" in message  # grad_presence
    assert "0.weight after step 2: error vs the fp64 truth" in message  # params_after_steps: it did not move
    assert "after pass 1" not in message  # iteration 1 (before the change) is right


@pytest.mark.parametrize("spec", [UNFREEZE, FREEZE, BASE.replace(schedule=((2, "swap"), (3, "bias_only")))],
                         ids=["unfreeze", "freeze", "swap-bias_only"])
def test_clean_twin_reading_requires_grad_every_call_passes(spec):
    verdicts = {v.check: v for v in CaseRun(spec, "rereads", RereadsRequiresGrad()).verify()}
    assert verdicts["grad_parity"].figures["iterations_compared"] == 3
    assert verdicts["grad_presence"].figures["presence_points_compared"] == 3
    assert verdicts["params_after_steps"].figures["steps_compared"] == 3
    assert verdicts["memory_retained"].ok
