"""The distributed lane on a LoRA Llama block: a clean FSDP2 run with a frozen base passes every check (no
reduce-scatter for frozen parameters), and planted wrappers that train or communicate the frozen base weights
are caught, naming the parameter."""
from __future__ import annotations

import pytest

from te_verify.distributed.pool.pool import RankPool
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import LORA_QV, _lora_spec, dist_lora_specs
from te_verify.spec import PROJECTIONS
from planted_wrappers import ddp_reducing_frozen_base, fsdp2_training_frozen_base

FSDP2 = _lora_spec("fsdp2", LORA_QV, options=(("reshard_after_forward", True),))
DDP = _lora_spec("ddp", LORA_QV)
# Trainable bytes of one block with LoRA on q and v (fp32): four adapters (4x32 and 32x4 each) and two norms.
TRAINABLE_BYTES = 4 * (4 * 32 * 4) + 2 * 32 * 4


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(world_size=2, case_timeout_s=60.0)
    yield pool
    pool.close(graceful=True)


def by_check(verdicts) -> dict:
    return {v.check: v for v in verdicts}


def test_generator_tiers_cover_fsdp2_with_a_frozen_base():
    assert len(dist_lora_specs("smoke")) == 2
    pr = dist_lora_specs("pr")
    assert len(pr) >= 10 and len({s.id for s in pr}) == len(pr)
    assert len(dist_lora_specs("nightly")) > len(pr)
    fsdp2 = [s for s in pr if s.dist.wrapper == "fsdp2"]
    assert {s.model.lora_on for s in fsdp2} == {LORA_QV, PROJECTIONS}
    assert {"before", "after"} <= {s.freeze_timing for s in fsdp2}
    assert all(s.dist.world_size == 2 and s.batch_shape[0] % 2 == 0 for s in pr)


@pytest.mark.system
def test_clean_fsdp2_on_a_lora_block_passes_and_reduces_only_trainable_bytes(pool):
    verdicts = by_check(verify_dist(FSDP2, pool, {}))
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values() if not v.ok]
    volume = verdicts["gradient_volume"].figures
    assert volume["collective_bytes_required"] == TRAINABLE_BYTES
    # FSDP2 reduce-scatters a unit in its post-backward hook, the root's in the end-of-backward callback.
    reduced = volume.get("reduce_scatter_backward_bytes", 0) + volume.get("reduce_scatter_backward_end_bytes", 0)
    assert TRAINABLE_BYTES <= reduced < 2 * TRAINABLE_BYTES
    assert verdicts["dist_waste_flops"].figures["flops_ratio"] == 1.0
    assert verdicts["dist_waste_saved"].figures["saved_bytes_required"] > 0


def test_planted_fsdp2_training_a_frozen_base_weight_is_caught(pool):
    verdicts = by_check(verify_dist(FSDP2, pool, {}, wrap=fsdp2_training_frozen_base))
    parity = verdicts["dist_grad_parity"].message
    assert "blocks.0.attn.q.base.weight: has a gradient after pass 1, expected None" in parity
    assert "blocks.0.attn.v.base.weight" not in parity and "lora_a" not in parity
    assert not verdicts["gradient_volume"].ok
    assert "the surplus of 4096 B is the size of blocks.0.attn.q.base.weight" in verdicts["gradient_volume"].message
    assert not verdicts["dist_waste_flops"].ok  # its wgrad GEMM: one more backward GEMM than required


def test_planted_ddp_reducing_frozen_base_gradients_is_caught_by_the_volume(pool):
    verdicts = by_check(verify_dist(DDP, pool, {}, wrap=ddp_reducing_frozen_base))
    assert verdicts["dist_grad_parity"].ok and verdicts["dist_output_parity"].ok  # exact gradients, extra traffic
    message = verdicts["gradient_volume"].message
    assert "frozen parameters (blocks.0.attn.q.base.weight, blocks.0.attn.k.weight" in message
    assert "were communicated" in message and "the surplus of 40960 B is the size of" in message


def test_clean_ddp_on_a_lora_block_passes(pool):
    verdicts = by_check(verify_dist(DDP, pool, {}))
    assert all(v.ok for v in verdicts.values()), [v.message for v in verdicts.values() if not v.ok]
    assert verdicts["dist_waste_flops"].figures["gemm_roles_judged"] is True
    assert verdicts["gradient_volume"].figures["all_reduce_backward_bytes"] == TRAINABLE_BYTES
