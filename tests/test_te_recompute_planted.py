"""Activation recompute in the TE lane (issue 34): torch's two checkpoints and TE's own `distributed.checkpoint`
around pairs of TE Linears pass every check of the TE lane; a recompute that also computes a frozen weight's wgrad
fails gemm_work naming the layer, one that keeps every activation fails te_saved_bytes. TE's checkpoint runs on CPU
through the CPU RNG step (compat.te_checkpoint_cpu over compat.cuda_rng_cpu), which refuses what it does not cover."""
from __future__ import annotations

import pytest
import torch

from planted_te_recompute import HandTECheckpoint
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_waste import gemm_work, saved_bytes
from te_verify.checks.verdict import CheckFailures
from te_verify.compat import cuda_rng_cpu, te_checkpoint_cpu
from te_verify.matrix.te_recompute import te_recompute_specs
from te_verify.oracle.required import required_saved
from te_verify.probes import default_probes
from te_verify.run.caserun import CaseRun
from te_verify.run.microbatch import run_mean_reduced
from te_verify.checks.fp8_scaling import fp8_scaling
from te_verify.run.te_case import te_probes, verify_te_stack
from te_verify.spec import CaseSpec, SpecError, TEConfig

# Two blocks, (0, 1) and (2, 3), each with a frozen weight inside (layers 1 and 3) behind a trainable one; high
# precision, distinct widths (TE's high-precision GEMMs take any).
FROZEN_INSIDE = CaseSpec("te_peft", (16, 24, 40, 8, 12), (False, True, False, True), None, True, (32,),
                         te=TEConfig(), recompute="te")
# The same under delayed scaling, on widths FP8 GEMMs take.
FP8_INSIDE = CaseSpec("te_fp8", (32, 64, 128, 64, 32), (False, True, False, True), None, True, (32,),
                      te=TEConfig(recipe="delayed"), recompute="te")

# expectations/te_eager.toml: the recompute's autocast entry sets it and nothing clears it before the next forward.
GAP = "TE first FP8 module True (was False)"


def test_te_checkpoint_modes_are_validated_and_named_only_off_the_default():
    assert FROZEN_INSIDE.id.endswith("-ckpt_te") and "ckpt" not in FROZEN_INSIDE.replace(recompute="none").id
    with pytest.raises(SpecError, match="recompute='te': TE's checkpoint needs the TE lane"):
        FROZEN_INSIDE.replace(te=None)
    with pytest.raises(SpecError, match="recompute='reentrant': the TE lane checkpoints a stack of te.Linear only"):
        FROZEN_INSIDE.replace(recompute="reentrant", te=TEConfig(module="grouped_linear"))


def test_torch_checkpoints_are_not_generated_under_fp8():
    """torch's checkpoint recomputes outside TE's autocast (matrix.te_recompute says why); TE's is generated."""
    specs = te_recompute_specs("te_peft", "nightly") + te_recompute_specs("te_fp8", "nightly")
    assert not [s.id for s in specs if s.recompute in ("reentrant", "nonreentrant") and s.te.recipe]
    assert {s.recompute for s in specs if s.te.recipe} == {"te"}  # te_nonreentrant: its saves are out of sight
    assert len(te_recompute_specs("te_peft", "pr")) + len(te_recompute_specs("te_fp8", "pr")) == 6


_STAND_INS = cuda_rng_cpu.stand_ins(te_checkpoint_cpu.MODULE, graph_safe_calls=True)


@pytest.mark.parametrize("call", [lambda: _STAND_INS["_get_cuda_rng_state"](clone=True),
                                  lambda: _STAND_INS["_get_cuda_rng_state"](device=1, graph_safe=False),
                                  lambda: _STAND_INS["_get_cuda_rng_state"](device="cuda:0"),
                                  lambda: _STAND_INS["_set_cuda_rng_state"](None, device="cuda:1", graph_safe=False),
                                  lambda: _STAND_INS["_set_cuda_rng_state"](torch.get_rng_state(), graph_safe=True)],
                         ids=["clone", "device_index", "graph_safe_device_index", "set_on_another_device",
                              "graph_safe_set_of_a_state_tensor"])
def test_the_cpu_rng_step_refuses_what_it_does_not_cover(call):
    with pytest.raises(cuda_rng_cpu.CudaRngStepError, match="distributed._.*covers only the default device"):
        call()


def test_the_oracle_keeps_only_the_second_blocks_input():
    assert [(layer, kind) for layer, kind, _ in required_saved(FROZEN_INSIDE).items] == [(2, "input")]


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant", "te", "te_nonreentrant"])
def test_torch_and_te_checkpoints_pass_every_check(te_python, mode):
    """The clean twins: each recompute seen as one more fprop per checkpointed TE Linear per backward pass."""
    spec = FROZEN_INSIDE.replace(recompute=mode)
    case = CaseRun(spec, "te_eager", TEEagerBackend())
    try:
        verify_te_stack(case)
    except CheckFailures:  # TE's checkpoint leaves TE's first-FP8-module flag set: its own known gap, nothing else
        assert mode.startswith("te")
    failed = {v.check: v.message for v in case.verdicts if not v.ok}
    if mode == "te_nonreentrant":  # TE's frame holds its region's saves: the saved check says it cannot see them
        assert "te_saved_bytes not observed: TE's non-reentrant checkpoint" in failed.pop("te_saved_bytes")
    assert set(failed) <= ({"process_state"} if mode.startswith("te") else set()), failed
    assert all(GAP in message for message in failed.values()), failed
    work = next(v for v in case.verdicts if v.check == "gemm_work")
    assert work.figures["gemms_by_role"]["fprop"] == 8  # 4 in the forward, 4 recomputed


def test_a_hand_written_checkpoint_passes_every_check(te_python):
    backend = HandTECheckpoint()
    verify_te_stack(CaseRun(FROZEN_INSIDE, backend.name, backend))


def _run(backend):
    record = run_mean_reduced(FROZEN_INSIDE, backend, default_probes("te_eager"))
    assert record.error is None, record.error
    return record


def test_a_recompute_that_computes_a_frozen_weights_wgrad_fails_naming_the_layer(te_python):
    record = _run(HandTECheckpoint("frozen_wgrad"))
    work = gemm_work(FROZEN_INSIDE.id, "hand_te_checkpoint_frozen_wgrad", FROZEN_INSIDE, record)
    assert not work.ok
    assert "layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in work.message
    assert "layer 3 (frozen weight): 1 wgrad GEMM, 0 required" in work.message
    assert saved_bytes(FROZEN_INSIDE.id, "hand", FROZEN_INSIDE, record).ok  # its own fault only


def test_a_recompute_that_keeps_every_activation_fails_the_saved_check(te_python):
    record = _run(HandTECheckpoint("hoard"))
    saved = saved_bytes(FROZEN_INSIDE.id, "hand_te_checkpoint_hoard", FROZEN_INSIDE, record)
    assert not saved.ok and "saved-for-backward 9,216 B in 3 tensors vs 5,120 B in 1 required" in saved.message
    assert "layer 1 (checkpointed: recomputed in backward): saved its input [32, 24] 3,072 B, 0 required" in saved.message
    assert "layer 3 (checkpointed: recomputed in backward): saved its input [32, 8] 1,024 B, 0 required" in saved.message
    assert gemm_work(FROZEN_INSIDE.id, "hand", FROZEN_INSIDE, record).ok  # it recomputes as the clean twin does


@pytest.mark.parametrize("backend", [TEEagerBackend(), HandTECheckpoint("fp8_autocast")], ids=["te", "autocast_inside"])
def test_a_recompute_that_rescales_fp8_fails_fp8_scaling(te_python, backend):
    """TE's checkpoint requantizes with the forward's scales and leaves the delayed-scaling state as the forward's
    update made it; a recompute re-entering TE's autocast in backward uses the updated scales and updates again."""
    case = CaseRun(FP8_INSIDE, backend.name, backend)
    record = run_mean_reduced(FP8_INSIDE, backend, te_probes(case))
    assert record.error is None, record.error
    verdict = fp8_scaling(FP8_INSIDE.id, backend.name, FP8_INSIDE, record)
    if backend.name == "te_eager":
        assert verdict.ok, verdict.message
        return
    assert not verdict.ok
    assert "(recompute in backward call 1): quantized with scale" in verdict.message
    assert "the forward's was 1.0" in verdict.message
