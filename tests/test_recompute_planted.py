"""Activation recompute: a recompute that computes a frozen weight's wgrad, or keeps every activation anyway, is
caught naming the layer; torch's non-reentrant and reentrant checkpoints and a hand-written one pass every check."""
from __future__ import annotations

import pytest

from planted_recompute import HandCheckpoint, NoRecompute
from waste_planted import failed, verdicts
from te_verify.backends.eager import EagerBackend
from te_verify.checks.verdict import CheckFailures
from te_verify.matrix.recompute import recompute_specs, reentrant_drops_grads
from te_verify.oracle.required import backward_gemms, required_saved
from te_verify.probes.flops import GemmProbe
from te_verify.run.caserun import CaseRun
from te_verify.run.runner import run_case
from te_verify.matrix.models import model_spec
from te_verify.spec import CaseSpec, DistConfig, ModelConfig, SpecError, TEConfig

# Two blocks, (0, 1) and (2, 3), each with a frozen weight inside (layers 1 and 3) behind a trainable one; distinct
# widths, so every weight shape names one layer.
FROZEN_INSIDE = CaseSpec("recompute", (16, 24, 40, 8, 12), (False, True, False, True), None, True, (32,),
                         recompute="nonreentrant")



def test_the_recompute_spec_field_is_validated_and_named_only_off_its_default():
    assert FROZEN_INSIDE.id.endswith("-ckpt_nonreentrant")
    assert "ckpt" not in FROZEN_INSIDE.replace(recompute="none").id
    with pytest.raises(SpecError, match="recompute='sometimes'"):
        FROZEN_INSIDE.replace(recompute="sometimes")
    with pytest.raises(SpecError, match="recompute='reentrant': the TE lane checkpoints a stack of te.Linear only"):
        FROZEN_INSIDE.replace(recompute="reentrant", te=TEConfig(module="grouped_linear"))
    with pytest.raises(SpecError, match="recompute='reentrant': not built for dist.wrapper='thunder_ddp'"):
        FROZEN_INSIDE.replace(recompute="reentrant", dist=DistConfig("thunder_ddp"))


def test_the_oracle_adds_each_block_fprop_once_per_pass_and_keeps_block_inputs():
    spec = FROZEN_INSIDE.replace(replays=2)
    assert sorted(g for g in backward_gemms(spec) if g[1] == "fprop") == [(i, "fprop") for i in range(4)]
    assert [(layer, kind) for layer, kind, _ in required_saved(spec).items] == [(2, "input")]  # x is the model input


def test_a_block_with_nothing_needing_grad_recomputes_nothing():
    spec = CaseSpec("recompute", (16,) * 7, (True,) * 4 + (False,) * 2, None, False, (8,), recompute="reentrant")
    assert sorted(g for g in backward_gemms(spec) if g[1] == "fprop") == [(4, "fprop"), (5, "fprop")]
    assert reentrant_drops_grads(spec)  # and the reentrant form drops block 2's gradients: not generated
    assert spec.id not in {s.id for s in recompute_specs("nightly")}


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_torch_checkpoints_pass_every_check(mode):
    """The clean twins: torch.utils.checkpoint either way, each pass's recompute seen as fprop GEMMs in backward."""
    spec = FROZEN_INSIDE.replace(recompute=mode, replays=2)
    CaseRun(spec, "eager", EagerBackend()).verify()
    record = run_case(spec, EagerBackend(), [GemmProbe()])
    rerun = {e.pass_index for e in record.observations["gemm_events"] if e.role == "fprop" and e.pass_index}
    assert rerun == {1, 2}  # every backward pass recomputes


def test_a_hand_written_checkpoint_passes_every_check():
    """A correct checkpoint written differently from torch's (autograd.grad over the trainable parameters)."""
    backend = HandCheckpoint()
    CaseRun(FROZEN_INSIDE, backend.name, backend).verify()


def test_a_recompute_that_computes_a_frozen_weights_wgrad_is_caught():
    found = verdicts(FROZEN_INSIDE, HandCheckpoint("frozen_wgrad"))
    assert failed(found) == {"waste_flops"}
    message = found["waste_flops"].message
    assert "backward pass 1: layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in message
    assert "backward pass 1: layer 3 (frozen weight): 1 wgrad GEMM, 0 required" in message
    with pytest.raises(CheckFailures, match="layer 1 .frozen weight.: 1 wgrad GEMM, 0 required"):
        CaseRun(FROZEN_INSIDE, "hand_checkpoint_frozen_wgrad", HandCheckpoint("frozen_wgrad")).verify()


def test_a_recompute_that_keeps_every_activation_is_caught():
    found = verdicts(FROZEN_INSIDE, HandCheckpoint("hoard"))
    assert failed(found) == {"waste_saved"}
    assert "layer 1 (frozen weight): saved input [32, 24] 3,072 B, 0 required" in found["waste_saved"].message
    assert "layer 3 (frozen weight): saved input [32, 8] 1,024 B, 0 required" in found["waste_saved"].message


@pytest.mark.parametrize("mode, rerun", [("nonreentrant", {0, 2}), ("reentrant", {0, 1, 2, 3})])
def test_a_square_stacks_recompute_is_told_from_its_dgrads_by_the_contracted_dimension(mode, rerun):
    """Square weights: every GEMM of a backward pass has the same shapes, so only the weight's contracted dimension
    tells a recomputed fprop from a dgrad. Torch's early stop skips each block's last linear (it saves its operands
    before its GEMM runs); the reentrant rerun runs every one."""
    spec = CaseSpec("recompute", (32,) * 5, (False,) * 4, None, True, (32,), recompute=mode)
    events = run_case(spec, EagerBackend(), [GemmProbe()]).observations["gemm_events"]
    backward = [(e.role, e.layer) for e in events if e.pass_index == 1]
    assert {layer for role, layer in backward if role == "fprop"} == rerun
    assert sorted(layer for role, layer in backward if role == "dgrad") == [0, 1, 2, 3]
    assert sorted(layer for role, layer in backward if role == "wgrad") == [0, 1, 2, 3]


def test_the_reentrant_pitfall_is_what_users_would_see():
    """Why the matrix leaves it out: a reentrant block whose input needs no gradient trains nothing, and where no
    later block trains either, backward raises."""
    spec = CaseSpec("recompute", (16,) * 5, (False,) * 4, None, False, (8,), recompute="reentrant")
    assert reentrant_drops_grads(spec) and not reentrant_drops_grads(spec.replace(input_requires_grad=True))
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        record = run_case(spec, EagerBackend(), [])
    assert "does not require grad" in str(record.error)


@pytest.mark.parametrize("spec, names", [
    (FROZEN_INSIDE.replace(weight_frozen=(False,) * 4), "layer 1 (trainable weight): saved input [32, 24] 3,072 B, "
                                                         "0 required"),
    (model_spec("recompute", ModelConfig(lora_on=("q", "v")), recompute="nonreentrant"),
     "sites blocks.0.attn.q.base, blocks.0.attn.q.lora_a, blocks.0.attn.k, blocks.0.attn.v.base, "
     "blocks.0.attn.v.lora_a: saved their input 1 time(s)"),
], ids=["stack", "llama"])
def test_a_backend_that_drops_the_checkpoint_is_caught_keeping_the_activations(spec, names):
    """Where the checkpoint saves memory (every layer trains; a Llama block's sites), a backend that ignores it
    keeps what the blocks' inputs replace: the saved check names it (the stack's figure, the family's per site)."""
    with pytest.raises(CheckFailures, match="saved") as failure:
        CaseRun(spec, "no_recompute", NoRecompute()).verify()
    assert names in str(failure.value)
    assert "GEMM" not in str(failure.value)  # recomputing nothing is no FLOPs fault: what it kept instead is
