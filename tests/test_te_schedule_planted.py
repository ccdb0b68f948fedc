"""Freeze schedules in the TE lane (issue 34, item 3): TE's own Python over the tex emulation, the trainable set
changed between iterations (planted_te_schedule). A build that keeps reading the FP8 weight copy it made while a
weight was frozen after that weight is unfrozen fails fp8_scaling (the weight not quantized in iterations 2 and 3)
and the values of iteration 3 (the first forward after the unfrozen weight's first step), naming the layer; a build
that keeps running the wgrad GEMM of a weight frozen mid-training fails gemm_work at iterations 2 and 3, naming the
layer. The clean twin (the same per-layer calls without either fault) passes every check of the unfreeze but the TE
gap recorded for the family, and the work checks of the high-precision freeze at every iteration."""
from __future__ import annotations

import pytest
from planted_te_schedule import CachesFrozenCopies, QuantizesEveryCall, StaleWgrad

from te_verify.checks.iterations import ITERATIONS_FIGURE, each_iteration
from te_verify.checks.te_waste import te_waste
from te_verify.checks.verdict import CheckFailures
from te_verify.probes import default_probes
from te_verify.run.caserun import CaseRun
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.te_case import verify_te_stack
from te_verify.spec import CaseSpec, SpecError, TEConfig

WIDTHS = (16, 32, 16)
UNFREEZE = CaseSpec("te_schedule", WIDTHS, (True, False), (True, False), False, (16,), te=TEConfig(recipe="current"),
                    schedule=((2, "unfreeze_all"),))
FREEZE = CaseSpec("te_schedule", WIDTHS, (False, False), (False, False), False, (16,), te=TEConfig(),
                  schedule=((2, "freeze_all_but_last"),))
# TE's FP8 weight copy kept with rowwise data where no dgrad reads it (expectations/te_eager.toml, TE PR 1770): the
# checks it fails in every FP8 case of the family at the emulated sm90, with the entry's failure text.
FP8_COPY_GAP = {"fp8_copies": "saved weight FP8 copy", "te_saved_bytes": "saved-for-backward"}


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _verdicts(spec: CaseSpec, backend) -> dict:
    """Every verdict of the TE lane's stack case on `backend`, passed or not, under te_eager's probes (the probe set
    follows the backend's name: these are TE builds)."""
    case = CaseRun(spec, "te_eager", backend)
    try:
        verify_te_stack(case)
    except CheckFailures:
        pass
    return {v.check: v for v in case.verdicts}


def _waste(spec: CaseSpec, backend) -> dict:
    """The TE lane's work checks at every iteration (checks.iterations), against the masks in force in each."""
    got = run_mean_reduced(spec, backend, default_probes("te_eager"))
    assert got.error is None, got.error
    return {v.check: v for v in each_iteration(spec, (got,), lambda at, runs: te_waste(spec.id, backend.name, at, *runs))}


def test_spec_takes_a_schedule_on_te_linear_stacks_only():
    assert UNFREEZE.id.endswith("-fp8current-sched2.unfreeze_all")
    assert CaseSpec.from_dict(UNFREEZE.to_dict()) == UNFREEZE
    with pytest.raises(SpecError, match=r"^te.module='grouped_linear': a freeze schedule runs on"):
        UNFREEZE.replace(te=TEConfig(module="grouped_linear"))
    with pytest.raises(SpecError, match=r"^te.main_grad=True: a freeze schedule is not built with it"):
        UNFREEZE.replace(te=TEConfig(main_grad=True))


def test_fp8_copy_not_refreshed_after_an_unfreeze_fails_scaling_and_values_at_iteration_3():
    verdicts = _verdicts(UNFREEZE, CachesFrozenCopies())
    failed = {c for c, v in verdicts.items() if not v.ok}
    assert {"fp8_scaling", "output_parity", "grad_parity"} <= failed, failed
    assert "weight 0.weight: quantized 0 time(s) in iteration 3, expected 1" in verdicts["fp8_scaling"].message
    assert "forward output (iteration 3)" in verdicts["output_parity"].message
    assert "iteration 3: grad of 1.weight" in verdicts["grad_parity"].message
    assert "iteration 2: grad" not in verdicts["grad_parity"].message  # the copy is still right before step 2
    assert verdicts["grad_presence"].ok and not verdicts["params_after_steps"].ok


def test_wgrad_kept_for_a_weight_frozen_mid_training_fails_gemm_work_from_iteration_2():
    verdicts = _waste(FREEZE, StaleWgrad())
    work = verdicts["gemm_work"]
    assert not work.ok and "iteration 2: " in work.message and "iteration 3: " in work.message, work.message
    assert "layer 0 (frozen weight): 1 wgrad GEMM, 0 required (FLOPs 16,384 vs 0" in work.message, work.message
    assert work.message.startswith("iteration 2: ")  # iteration 1, before the change, is right
    assert "layer 1 (input needs no grad): 1 dgrad GEMM, 0 required" in work.message  # TE feeds the stale wgrad


def test_clean_twin_passes_every_check_of_the_unfreeze_but_the_recorded_te_gap():
    verdicts = _verdicts(UNFREEZE, QuantizesEveryCall())
    failed = {c: v.message for c, v in verdicts.items() if not v.ok}
    assert set(failed) == set(FP8_COPY_GAP), {c: m[:300] for c, m in failed.items()}
    assert all(text in failed[c] for c, text in FP8_COPY_GAP.items())
    assert verdicts["grad_parity"].figures["iterations_compared"] == 3
    assert verdicts["gemm_work"].figures[ITERATIONS_FIGURE] == 3


def test_clean_twin_passes_the_work_checks_of_the_freeze_at_every_iteration():
    verdicts = _waste(FREEZE, QuantizesEveryCall())
    assert all(v.ok for v in verdicts.values()), {c: v.message[:300] for c, v in verdicts.items() if not v.ok}
    assert verdicts["gemm_work"].figures[ITERATIONS_FIGURE] == 3
