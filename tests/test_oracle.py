"""The oracle's required figures from DESIGN.md's rules, against hand counts and the notes' FLOPs."""
from __future__ import annotations

import pytest

from te_verify.oracle.required import input_needs_grad, required_bias_grads, required_flops, required_gemms, required_peak, required_saved, sites
from te_verify.spec import CaseSpec, TEConfig

MM = 2 * 32 * 64 * 64  # one 32x64x64 GEMM


def notes_spec(frozen, x_grad=False, **kw) -> CaseSpec:
    return CaseSpec("oracle", (64, 64, 64, 64), frozen, kw.pop("bias", None), x_grad, (32,), **kw)


@pytest.mark.parametrize("frozen, flops", [
    ((False, False, False), 2_097_152), ((False, True, False), 1_835_008),
    ((True, False, False), 1_572_864), ((True, True, True), 786_432),
])
def test_required_flops_equal_the_notes_measurements(frozen, flops):
    assert required_flops(notes_spec(frozen)) == flops


def test_gemms_by_role_follow_the_rules():
    spec = notes_spec((True, False, True))
    assert required_gemms(spec) == [(0, "fprop"), (1, "fprop"), (2, "fprop"), (2, "dgrad"), (1, "wgrad")]


def test_a_trainable_bias_upstream_makes_later_inputs_need_grad():
    spec = notes_spec((True, True, True), bias=(False, True, True))
    assert input_needs_grad(spec) == (False, True, True)
    assert required_bias_grads(spec) == [0]
    assert [g for g in required_gemms(spec) if g[1] != "fprop"] == [(2, "dgrad"), (1, "dgrad")]


def test_replays_multiply_backward_work_and_unfreeze_after_uses_the_unfrozen_masks():
    assert required_flops(notes_spec((False, True, False), replays=3)) == 3 * MM + 3 * 4 * MM
    assert required_flops(notes_spec((True, True, True), freeze_timing="unfreeze_after")) == 8 * MM


def test_saved_plain_counts_only_new_layer_inputs():
    assert required_saved(notes_spec((False, False, False), x_grad=True)).nbytes == 2 * 8192
    need = required_saved(notes_spec((True, False, True)))
    assert (need.nbytes, need.count, need.items) == (8192, 1, ((1, "input", 8192),))
    assert required_saved(notes_spec((True, True, True))).count == 0


def test_saved_fp8_counts_input_and_weight_copies_where_needed_in_tes_format():
    """One layout of the data (1 B per element) and a 4-byte scale_inv per copy, each its own storage."""
    spec = notes_spec((False, True, False), te=TEConfig(recipe="delayed"))
    items = required_saved(spec).items
    assert items == ((0, "input", 32 * 64), (0, "input_scale_inv", 4), (1, "weight_copy", 64 * 64),
                     (1, "weight_copy_scale_inv", 4), (2, "input", 32 * 64), (2, "input_scale_inv", 4),
                     (2, "weight_copy", 64 * 64), (2, "weight_copy_scale_inv", 4))


def test_experts_are_sites_on_their_share_of_the_rows():
    spec = CaseSpec("te_moe", (32, 32), (False,), (False,), False, (64,),
                    te=TEConfig(None, "grouped_linear", experts=4, frozen_experts=(1,)))
    assert [(s.label, s.rows, s.weight_trainable) for s in sites(spec)] == [
        ("0.e0", 16, True), ("0.e1", 16, False), ("0.e2", 16, True), ("0.e3", 16, True)]
    assert required_flops(spec) == 2 * 16 * 32 * 32 * (4 + 3)  # 4 fprops, 3 wgrads, no dgrad (x needs none)


def test_peak_bound_grows_with_saved_and_replays():
    one = required_peak(notes_spec((False, False, False)))
    assert required_peak(notes_spec((False, False, False), replays=2)) > one > required_peak(notes_spec((True, True, False)))
