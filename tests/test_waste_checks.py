"""The waste checks pass clean runs and catch every planted fault, naming the layer and role."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from te_verify.backends.eager import EagerBackend
from te_verify.checks.waste import waste_verdicts
from te_verify.matrix.stacks import FAMILIES
from te_verify.probes import default_probes
from te_verify.run.runner import run_case
from te_verify.spec import CaseSpec
from waste_planted import DiscardedRecompute, PlantedBackend, SplitK, failed, verdicts

FIGURE_KEYS = {"flops_actual", "flops_required", "flops_ratio", "saved_bytes_actual", "saved_bytes_required",
               "saved_bytes_ratio", "saved_count_actual", "saved_count_required", "peak_bytes", "peak_backward_bytes"}
# Layer 1 frozen, its input needs grad (layer 0 trainable): its wgrad must not run. Distinct widths so that
# every weight shape names one layer.
MIDDLE_FROZEN = CaseSpec("waste", (16, 24, 40, 8), (False, True, False), None, False, (32,))



@pytest.mark.parametrize("spec", [s for family in FAMILIES.values() for s in family("smoke")], ids=lambda s: s.id)
def test_eager_meets_every_required_figure_exactly(spec):
    record = run_case(spec, EagerBackend(), default_probes("eager"))
    found = waste_verdicts(spec, record, "eager")
    assert [v.message for v in found if not v.ok] == []
    figures = {k: v for verdict in found for k, v in verdict.figures.items()}
    assert FIGURE_KEYS <= set(figures) or "waste_skipped" in figures
    if "flops_ratio" in figures:
        assert figures["flops_ratio"] == 1.0


def test_the_planted_backend_without_faults_is_clean():
    assert failed(verdicts(MIDDLE_FROZEN, PlantedBackend())) == set()


def test_discarded_wgrad_for_a_frozen_weight_is_caught():
    found = verdicts(MIDDLE_FROZEN, PlantedBackend("discarded_wgrad"))
    assert "waste_flops" in failed(found)
    assert "layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in found["waste_flops"].message
    assert found["waste_flops"].figures["flops_ratio"] > 1.0


def test_an_extra_saved_activation_per_layer_is_caught():
    found = verdicts(MIDDLE_FROZEN, PlantedBackend("extra_activation"))
    assert "waste_saved" in failed(found)  # the copies also lift the peak over its bound
    assert found["waste_saved"].figures["saved_bytes_ratio"] > 1.0
    assert "saved other [32, 24]" in found["waste_saved"].message


def test_a_weight_copy_for_a_layer_without_dgrad_is_caught():
    found = verdicts(MIDDLE_FROZEN, PlantedBackend("weight_copy"))
    assert failed(found) == {"waste_saved"}
    assert "layer 0 (input needs no grad, dgrad not needed): saved weight_copy [24, 16] 384 B" \
        in found["waste_saved"].message


def test_a_large_backward_temporary_is_caught_by_the_peak_check():
    found = verdicts(MIDDLE_FROZEN, PlantedBackend("big_temporary"))
    assert failed(found) == {"waste_peak"}
    assert found["waste_peak"].figures["peak_backward_bytes"] > found["waste_peak"].figures["peak_required"]


@pytest.mark.parametrize("op", ["addmm_", "mm_out", "baddbmm_"])
def test_a_discarded_recompute_fails_whatever_op_wrote_it(op):
    """Each forward GEMM once more, its result thrown away: in place, into out= or batched, it is work."""
    found = verdicts(MIDDLE_FROZEN, DiscardedRecompute(op))
    assert "waste_flops" in failed(found)
    message = found["waste_flops"].message
    assert "FLOPs 339,968 vs 233,472 required" in message
    assert "forward: layer 0 (trainable weight): 2 fprop GEMM, 1 required (FLOPs 49,152 vs 24,576 required)" in message
    assert "forward: layer 1 (frozen weight): 2 fprop GEMM, 1 required (FLOPs 122,880 vs 61,440 required)" in message


# Every role split: bias, input gradient, replays, a 3-D input, a square stack (layers told apart by data alone).
SQUARE = CaseSpec("waste", (32, 32, 32, 32), (False, True, False), (False, False, True), True, (4, 8), replays=2)


@pytest.mark.parametrize("spec", [MIDDLE_FROZEN, SQUARE], ids=lambda s: s.id)
def test_split_k_is_the_work_of_the_layers_it_splits(spec):
    """Two half-K GEMMs per fprop, dgrad and wgrad, over views of the weights, inputs and output gradients: the
    FLOPs of one, each attributed to its layer and role (none judged by role only)."""
    found = verdicts(spec, SplitK())
    eager = verdicts(spec, EagerBackend())
    assert failed(found) == set(), [v.message for v in found.values() if not v.ok]
    figures, eager_figures = found["waste_flops"].figures, eager["waste_flops"].figures
    assert figures["gemms_by_role"] == {role: 2 * n for role, n in eager_figures["gemms_by_role"].items()}
    assert figures["flops_by_role"] == eager_figures["flops_by_role"]
    assert "gemm_attribution" not in figures


def test_a_split_k_with_a_half_missing_or_repeated_fails():
    """Half of a GEMM's FLOPs is a missing GEMM; three halves are waste."""
    from te_verify.checks.waste import gemm_problems

    spec = CaseSpec("waste", (4, 4), (False,), None, False, (2,))
    halves = [_event(0, "fprop", 0, 32), _event(1, "wgrad", 0, 32)]
    problems, _ = gemm_problems(spec, halves + [_event(0, "fprop", 0, 32), _event(1, "wgrad", 0, 32)])
    assert problems == []
    problems, _ = gemm_problems(spec, halves + [_event(0, "fprop", 0, 32)])
    assert problems == ["backward pass 1: layer 0 (trainable weight): 1 wgrad GEMM, 1 required (FLOPs 32 vs 64 "
                        "required) (GEMM work missing)"]
    problems, _ = gemm_problems(spec, halves * 2 + [_event(1, "wgrad", 0, 32)])
    assert problems == ["backward pass 1: layer 0 (trainable weight): 3 wgrad GEMM, 1 required (FLOPs 96 vs 64 "
                        "required)"]


@pytest.mark.system
def test_split_k_passes_the_torch_lane(tmp_path):
    from proof_tier import PROOF_TIER, PROOF_WORKERS, torch_lane_cases
    from test_plugin import run_pytest

    proc = run_pytest("cases", "--tier", PROOF_TIER, "--backend", "waste_planted:SplitK", "-n", PROOF_WORKERS,
                      "--report-dir", str(tmp_path))
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert proc.returncode == 0, proc.stdout[-3000:]
    outcomes = Counter(r["outcome"] for r in rows if r["backend"] == "split_k")
    assert outcomes["failed"] == 0 and outcomes["passed"] >= 0.6 * torch_lane_cases(), outcomes


def _event(pass_index: int, role: str, layer, flops: int = 2):
    from te_verify.probes.flops import GemmEvent

    return GemmEvent("forward" if pass_index == 0 else "backward", pass_index, role, layer, "aten.mm.default",
                     (2, 2), flops)


def test_a_gemm_run_as_other_ops_is_a_note_and_a_surplus_still_fails():
    """inductor lowers a k=1 matmul to a pointwise product: a shortfall is noted, never waste; a surplus fails."""
    from te_verify.checks.waste import gemm_problems

    spec = CaseSpec("waste", (1, 1), (False,), None, False, (1,))
    problems, notes = gemm_problems(spec, [])
    assert problems == [] and any("not seen as a GEMM" in n for n in notes)
    problems, _ = gemm_problems(spec, [_event(0, "fprop", 0), _event(1, "wgrad", 0), _event(1, "wgrad", 0)])
    assert problems == ["backward pass 1: layer 0 (trainable weight): 2 wgrad GEMM, 1 required (FLOPs 4 vs 2 required)"]


def test_same_shaped_sites_swapped_by_a_reused_buffer_are_judged_by_role():
    """Two trainable same-shaped layers: a wgrad credited to the wrong one is no surplus; an extra one still is."""
    from te_verify.checks.waste import gemm_problems

    spec = CaseSpec("waste", (4, 4, 4), (False, False), None, False, (2,))
    forward = [_event(0, "fprop", 0, 64), _event(0, "fprop", 1, 64)]
    swapped = forward + [_event(1, "dgrad", 1, 64), _event(1, "wgrad", 1, 64), _event(1, "wgrad", 1, 64)]
    problems, notes = gemm_problems(spec, swapped)
    assert problems == [] and any("same-shaped" in n for n in notes)
    problems, _ = gemm_problems(spec, swapped + [_event(1, "wgrad", 1, 64)])
    assert problems == ["backward pass 1: all layers: 3 wgrad GEMM, 2 required (FLOPs 192 vs 128 required)"]
