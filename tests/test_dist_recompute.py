"""Activation recompute in the distributed lane: the spec admits torch's checkpoint under the wrappers and engines it
is built for (one-line refusals for the rest), the family's tiers, the oracle's recompute-only gather allowance, and
on the rank pool a rank-side recompute that computes a frozen weight's wgrad fails dist_waste_flops naming the layer
and the rank while torch's checkpoint and a hand-written correct one pass."""
from __future__ import annotations

import pytest
import torch

from te_verify.distributed.verify import layer_infos, param_infos
from te_verify.matrix.dist import MIDDLE, _spec
from te_verify.matrix.dist_recompute import ALTERNATING, FAMILY, WIDTHS, dist_recompute_specs, timeline_blind
from te_verify.spec import RECOMPUTE_WRAPPERS, DistConfig, SpecError, TEConfig

CASE = _spec(FAMILY, "ddp", MIDDLE, True, widths=WIDTHS).replace(recompute="reentrant")


def test_the_spec_admits_torch_checkpoints_under_the_built_wrappers_and_refuses_the_rest_in_one_line():
    assert CASE.id.endswith("-ddp.ws2-ckpt_reentrant")
    for wrapper in RECOMPUTE_WRAPPERS:
        CASE.replace(dist=DistConfig(wrapper))
    with pytest.raises(SpecError, match="recompute='reentrant': not built for dist.wrapper='thunder_ddp'"):
        CASE.replace(dist=DistConfig("thunder_ddp"))
    with pytest.raises(SpecError, match="recompute='te': the distributed lane checkpoints a linear stack of torch"):
        CASE.replace(recompute="te", te=TEConfig())


def test_megatrons_own_checkpoint_runs_under_megatron_ddp_only():
    CASE.replace(dist=DistConfig("megatron_ddp"), recompute="megatron")
    with pytest.raises(SpecError, match="recompute='megatron': the engine's own checkpoint runs under .*'ddp'"):
        CASE.replace(recompute="megatron")


def test_deepspeeds_own_checkpoint_runs_under_its_zero_stages_only():
    for stage in (1, 2, 3):
        CASE.replace(dist=DistConfig(f"deepspeed_zero{stage}"), recompute="deepspeed")
    with pytest.raises(SpecError, match="recompute='deepspeed': the engine's own checkpoint runs under .*'ddp'"):
        CASE.replace(recompute="deepspeed")
    with pytest.raises(SpecError, match="recompute='deepspeed': an engine's own checkpoint needs the distributed lane"):
        CASE.replace(dist=None, recompute="deepspeed")


def test_the_family_draws_three_pr_cases_and_every_built_wrapper_in_nightly():
    pr, nightly = dist_recompute_specs("pr"), dist_recompute_specs("nightly")
    assert dist_recompute_specs("smoke") == [] and len(pr) == 3
    assert {s.id for s in pr} <= {s.id for s in nightly}
    assert {s.dist.wrapper for s in nightly} == set(RECOMPUTE_WRAPPERS)
    assert {s.recompute for s in nightly} == {"nonreentrant", "reentrant", "deepspeed", "megatron"}
    assert {s.dist.wrapper for s in nightly if s.recompute == "deepspeed"} == {f"deepspeed_zero{k}" for k in (1, 2, 3)}
    assert {s.dist.wrapper for s in nightly if s.recompute == "megatron"} == {"megatron_ddp"}
    assert not any(timeline_blind(s) for s in nightly)
    assert timeline_blind(CASE.replace(dist=DistConfig("fsdp2")))  # frozen layer 1 inside block (0, 1)
    alternating = _spec(FAMILY, "fsdp2", ALTERNATING, True, widths=WIDTHS).replace(recompute="reentrant")
    assert timeline_blind(alternating)  # frozen layer 2 at block (2, 3)'s input, its dgrad needed (ZeRO-3 measured)
    assert not timeline_blind(alternating.replace(dist=DistConfig("ddp")))  # no sharding: no timeline judged


def test_a_frozen_layer_recomputed_for_the_next_layers_wgrad_may_be_gathered_in_backward():
    """Alternating mask without input grad: layer 0 (frozen, no dgrad) is recomputed in block (0, 1)'s backward, so
    a sharding wrapper needs it gathered there; layer 2 (frozen, block (2, 3)'s input) is not recomputed."""
    spec = _spec(FAMILY, "fsdp2", ALTERNATING, False, widths=WIDTHS).replace(recompute="nonreentrant")
    layers = layer_infos(spec, param_infos(spec))
    assert [(l.input_needs_grad, l.recomputed, l.needed_in_backward) for l in layers][:3] == [
        (False, True, True), (False, True, True), (True, True, True)]
    assert not layer_infos(spec.replace(recompute="none"), param_infos(spec))[0].needed_in_backward


@pytest.fixture(scope="module")
def pool():
    from te_verify.distributed.pool.pool import RankPool

    pool = RankPool(world_size=2, case_timeout_s=300.0)
    yield pool
    pool.close(graceful=True)


def _verdicts(pool, wrap=None) -> dict:
    from te_verify.distributed.verify import verify_dist

    return {v.check: v for v in verify_dist(CASE.replace(recompute="nonreentrant"), pool, {}, wrap=wrap)}


# The pool runs its ranks in other processes: system tests (scripts/system_tests.sh), not the test command's.
@pytest.mark.system
@pytest.mark.parametrize("wrap", [None, "ddp_hand_checkpoint"], ids=["torch_checkpoint", "hand_checkpoint"])
def test_torch_checkpoint_and_a_hand_written_one_pass_every_check_on_every_rank(pool, wrap):
    import planted_dist_recompute

    verdicts = _verdicts(pool, wrap and getattr(planted_dist_recompute, wrap))
    assert not [k for k, v in verdicts.items() if not v.ok], {k: v.message for k, v in verdicts.items() if not v.ok}
    assert verdicts["dist_waste_flops"].figures["gemms_by_role"]["fprop"] > 4  # the recompute's fprops in backward


@pytest.mark.system
def test_a_rank_side_recompute_computing_a_frozen_wgrad_fails_dist_waste_flops_naming_layer_and_rank(pool):
    from planted_dist_recompute import ddp_recompute_with_frozen_wgrad

    verdicts = _verdicts(pool, ddp_recompute_with_frozen_wgrad)
    assert {k for k, v in verdicts.items() if not v.ok} == {"dist_waste_flops"}
    message = verdicts["dist_waste_flops"].message
    for rank in (0, 1):
        assert f"[ddp rank {rank}, its shard (4,)]" in message
    assert "backward pass 1: layer 1 (frozen weight): 1 wgrad GEMM, 0 required" in message


def test_an_engines_checkpoint_runs_every_block_where_the_engine_set_it_and_torchs_reentrant_elsewhere():
    from te_verify.models.recompute import CheckpointedStack, torch_equivalent

    layers = [torch.nn.Linear(4, 4) for _ in range(4)]
    stack = CheckpointedStack(layers, "deepspeed")
    calls = []
    x = torch.randn(2, 4, requires_grad=True)
    reference = stack(x)  # no engine: torch's reentrant checkpoint in its place
    stack.checkpoint = lambda block, rows: calls.append(rows.shape) or block(rows)
    assert torch.equal(stack(x), reference) and calls == [(2, 4), (2, 4)]  # one call per block of two layers
    assert torch_equivalent("deepspeed") == "reentrant" and torch_equivalent("nonreentrant") == "nonreentrant"


def test_megatrons_cpu_rng_step_refuses_what_it_does_not_cover():
    from te_verify.compat import cuda_rng_cpu, megatron_checkpoint_cpu

    get_state = cuda_rng_cpu.stand_ins(megatron_checkpoint_cpu.MODULE)["_get_cuda_rng_state"]
    assert get_state(graph_safe=False).dtype == torch.uint8  # the CPU generator's state
    with pytest.raises(cuda_rng_cpu.CudaRngStepError, match="tensor_parallel.random._get_cuda_rng_state.*graph_safe=True"):
        get_state(graph_safe=True)
