"""The TE lane's waste at every iteration (issue 36, item 1): TE's own Python over the tex emulation whose GEMM runs
every fprop twice from the first call after an optimizer step fails gemm_work naming iteration 2; its twin, split-K
GEMMs from then on (the same FLOPs and operand bytes), passes every iteration (planted_te_iterations). The same
build under the microbatch families' runner (run.microbatch: two microbatches, delayed wgrad) fails gemm_work naming
iteration 2 and the microbatch, and one saving a copy of each microbatch's input from then on fails te_saved_bytes;
their twins pass every iteration there too."""
from __future__ import annotations

import pytest
from planted_te_iterations import SteppedMicrobatchTE, SteppedTE, stepping

from te_verify.checks.iterations import ITERATIONS_FIGURE, each_iteration
from te_verify.checks.te_accumulation import microbatch_waste
from te_verify.checks.te_waste import te_waste
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced, run_microbatches
from te_verify.spec import CaseSpec, TEConfig

ALT = (True, False, True, False)
SPEC = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, True, (16,), te=TEConfig(recipe=None))


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _waste(mode: str) -> dict:
    with stepping(mode):
        got = run_mean_reduced(SPEC, SteppedTE(), default_probes("te_eager"))
    assert got.error is None, got.error
    return {v.check: v for v in each_iteration(SPEC, (got,), lambda at, runs: te_waste(SPEC.id, "te_eager", at, *runs))}


def test_te_build_recomputing_fprop_from_iteration_2_fails_gemm_work_naming_it():
    verdicts = _waste("recompute")
    work = verdicts["gemm_work"]
    assert not work.ok and work.message.startswith("iteration 2: "), work.message
    assert "layer 0: 2 fprop GEMMs, 1 required (FLOPs 131,072 vs 65,536" in work.message
    assert "iteration 3: " in work.message
    assert verdicts["te_saved_bytes"].ok


def test_clean_twin_splitting_k_from_iteration_2_passes_every_iteration():
    verdicts = _waste("split_k")
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values()]
    assert verdicts["gemm_work"].figures[ITERATIONS_FIGURE] == 3


TRAINED = (False,) * 4
MICROBATCHES = CaseSpec("te_delayed", (32, 64, 128, 64, 32), TRAINED, TRAINED, True, (16,),
                        te=TEConfig(recipe=None, microbatches=2, delay_wgrad=True))


def _microbatch_waste(mode: str, keeps_copy: bool = False) -> dict:
    with stepping(mode):
        got = run_microbatches(MICROBATCHES, SteppedMicrobatchTE(keeps_copy), default_probes("te_eager"))
    assert got.error is None, got.error
    verdicts = each_iteration(MICROBATCHES, (got,), lambda at, runs: microbatch_waste(MICROBATCHES.id, "te_eager", at,
                                                                                       *runs))
    return {v.check: v for v in verdicts}


def _microbatch_work(mode: str):
    return _microbatch_waste(mode)["gemm_work"]


def test_microbatch_te_build_recomputing_fprop_from_iteration_2_fails_gemm_work_naming_it():
    work = _microbatch_work("recompute")
    assert not work.ok and work.message.startswith("iteration 2: "), work.message
    for m in (1, 2):
        assert f"microbatch {m}: layer 0: 2 fprop GEMMs, 1 required (FLOPs 131,072 vs 65,536" in work.message
    assert "iteration 3: " in work.message and "iteration 1" not in work.message


def test_microbatch_clean_twin_splitting_k_from_iteration_2_passes_every_iteration():
    work = _microbatch_work("split_k")
    assert work.ok, work.message
    assert work.figures[ITERATIONS_FIGURE] == 3 and work.figures["microbatches"] == 2
    assert work.figures["flops_actual"] == work.figures["flops_required"] > 0


def test_microbatch_te_build_saving_a_copy_from_iteration_2_fails_te_saved_bytes_naming_it():
    verdicts = _microbatch_waste("te", keeps_copy=True)
    saved = verdicts["te_saved_bytes"]
    assert not saved.ok and saved.message.startswith("iteration 2: "), saved.message
    assert "saved-for-backward 40,960 B in 10 tensors vs 32,768 B in 6 required" in saved.message, saved.message
    assert "no FP8 copy or layer input accounts for: 2 x float32[16, 32] (4,096 B)" in saved.message
    assert "iteration 3: " in saved.message and "iteration 1" not in saved.message
    assert verdicts["gemm_work"].ok, verdicts["gemm_work"].message


def test_microbatch_clean_twin_saves_each_microbatchs_inputs_at_every_iteration():
    saved = _microbatch_waste("te")["te_saved_bytes"]
    assert saved.ok, saved.message
    assert saved.figures[ITERATIONS_FIGURE] == 3
    assert (saved.figures["saved_bytes_actual"], saved.figures["saved_count_actual"]) == (32_768, 6)


TIED = MICROBATCHES.replace(widths=(32,) * 5, te=TEConfig(recipe=None, microbatches=2, delay_wgrad=True, tied=(1, 2)))


def _tied_work(mode: str):
    with stepping(mode):
        got = run_microbatches(TIED, SteppedMicrobatchTE(), default_probes("te_eager"))
    assert got.error is None, got.error
    verdicts = each_iteration(TIED, (got,), lambda at, runs: microbatch_waste(TIED.id, "te_eager", at, *runs))
    return {v.check: v for v in verdicts}["gemm_work"]


def test_tied_weight_gemms_judged_together_a_recomputed_fprop_fails_naming_the_tied_layer():
    work = _tied_work("recompute")
    assert not work.ok and work.message.startswith("iteration 2: "), work.message
    assert "microbatch 1: layer 1 (tied weight): 4 fprop GEMMs, 2 required (FLOPs 131,072 vs 65,536" in work.message
    assert "layer 2" not in work.message  # provenance names the Parameter's layer for both uses


def test_tied_weight_clean_twin_splitting_k_passes_every_iteration():
    work = _tied_work("split_k")
    assert work.ok, work.message
    assert work.figures[ITERATIONS_FIGURE] == 3
