"""Waste judged at every iteration (issue 36, item 1): faults that waste only from the second (or third) iteration
on, planted in the torch lane, the TE lane and a distributed wrapper, each fail their waste check naming the
iteration; each clean twin, which changes path after the first optimizer step too but stays minimal, passes. The TE
lane's are in test_iteration_waste_te.py, the distributed wrapper's in test_schedule_dist_planted.py (its rank pool).
Also gradient accumulation (two microbatches per iteration): the same backend fails waste_flops naming the iteration
and both microbatches."""
from __future__ import annotations

import pytest

from planted_iterations import KeepsOutputsFromThirdIteration, LosesFrozenAfterStep, RecompilesCorrectly
from te_verify.checks.accumulation import accumulated_work
from te_verify.checks.iterations import ITERATIONS_FIGURE, each_iteration
from te_verify.models.schedule import spec_at
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.probes import default_probes
from te_verify.record import Record
from te_verify.run.caserun import CaseRun
from te_verify.run.microbatch import run_microbatches
from te_verify.spec import CaseSpec

# Layer 1 frozen behind a trained layer 0: its backward runs (dgrad), its wgrad is not needed.
MIDDLE_FROZEN = CaseSpec("freeze", (8, 16, 16, 8), (False, True, False), (False, True, False))


def _failures(spec: CaseSpec, backend) -> dict[str, str]:
    with pytest.raises(CheckFailures) as info:
        CaseRun(spec, backend.name, backend).verify()
    return {v.check: v.message for v in info.value.verdicts if not v.ok}


def test_torch_backend_wasting_from_iteration_2_fails_naming_it():
    failed = _failures(MIDDLE_FROZEN, LosesFrozenAfterStep())
    assert set(failed) == {"waste_flops", "waste_saved", "waste_peak"}, failed
    for message in failed.values():
        assert message.startswith("iteration 2: "), message  # iteration 1 is eager's
        assert "iteration 3: " in message
    assert "backward pass 1: layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in failed["waste_flops"]
    assert "layer 1 (frozen weight): saved input [8, 16] 512 B, 0 required" in failed["waste_saved"]


@pytest.mark.parametrize("spec", [MIDDLE_FROZEN, MIDDLE_FROZEN.replace(schedule=((2, "unfreeze_all"),))],
                         ids=["freeze", "schedule"])
def test_clean_twin_recompiling_to_split_k_after_a_step_passes_every_iteration(spec):
    """After the unfreeze, iteration 2 needs layer 1's wgrad: judged against the oracle of the masks then (spec_at)."""
    verdicts = {v.check: v for v in CaseRun(spec, "recompiles", RecompilesCorrectly()).verify()}
    for check in ("waste_flops", "waste_saved", "waste_peak"):
        assert verdicts[check].figures[ITERATIONS_FIGURE] == 3
    assert "iteration 3's" in verdicts["memory_retained"].figures["retained_compared"]


def test_memory_kept_from_iteration_3_fails_memory_retained_naming_it():
    failed = _failures(MIDDLE_FROZEN, KeepsOutputsFromThirdIteration())
    assert set(failed) == {"memory_retained"}, failed
    assert "iteration 3: a training step after the measured one retained 256 B" in failed["memory_retained"]
    assert "closure kept" in failed["memory_retained"]


def test_spec_at_takes_the_schedules_masks_and_keeps_the_rest():
    spec = MIDDLE_FROZEN.replace(schedule=((3, "swap"),))
    assert spec_at(spec, 2) is spec
    at3 = spec_at(spec, 3)
    assert (at3.weight_frozen, at3.bias_frozen, at3.schedule) == ((True, False, True), (True, False, True), ())
    assert at3.widths == spec.widths and at3.replays == spec.replays


def test_a_later_iteration_not_completed_is_not_judged():
    """A run that raised in iteration 3 is judged on iterations 1 and 2 (ending says how it ended)."""
    seen = []

    def judge(spec, runs):
        seen.append(runs[0].figures.get("k"))
        return [Verdict("waste_flops", True)]

    record = Record("b", error=RuntimeError("x"), error_iteration=3, later={2: ({"k": 2}, {}), 3: ({"k": 3}, {})})
    verdicts = each_iteration(MIDDLE_FROZEN, (record,), judge)
    assert seen == [None, 2] and verdicts[0].figures[ITERATIONS_FIGURE] == 2


# Gradient accumulation on the torch lane (run.microbatch, checks.accumulation): two microbatches per iteration.
ACCUMULATING = MIDDLE_FROZEN.replace(microbatches=2)


def _accumulated(backend) -> Verdict:
    got = run_microbatches(ACCUMULATING, backend, default_probes(backend.name))
    assert got.error is None, got.error
    verdicts = each_iteration(ACCUMULATING, (got,), lambda at, runs: [accumulated_work(at, runs[0], backend.name)])
    return verdicts[0]


def test_accumulating_backend_wasting_from_iteration_2_fails_waste_flops_naming_iteration_and_microbatch():
    work = _accumulated(LosesFrozenAfterStep())
    assert not work.ok and work.message.startswith("iteration 2: "), work.message
    for m in (1, 2):
        assert f"microbatch {m} backward pass 1: layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in work.message
    assert "iteration 3: " in work.message and "iteration 1" not in work.message


def test_accumulating_clean_twin_passes_every_iteration():
    work = _accumulated(RecompilesCorrectly())
    assert work.ok, work.message
    assert work.figures[ITERATIONS_FIGURE] == 3 and work.figures["microbatches"] == 2
