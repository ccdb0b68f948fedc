"""A collective's payload named by the engine's declared buffer layout (Wrapped.buffer_layout), not by matching
values: a bucket's padding holding an earlier case's copy of a frozen parameter names nothing, where content
matching alone would name it; a real Megatron-FSDP case still names what it really gathers."""
from __future__ import annotations

import pytest
import torch

from te_verify.distributed.engines.layout import owned_ranges
from te_verify.distributed.pool.pool import RankPool
from te_verify.distributed.rank.carried import Attribution, ContentIndex
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import MIDDLE, _spec
from te_verify.spec import ITERATIONS
from te_verify.checks.collectives import Carried
from planted_stale_buckets import megatron_fsdp_stale_by_content, megatron_fsdp_with_stale_padding
from proof_tier import PROOF_TIER

WEIGHT, BIAS = torch.randn(64), torch.randn(8)


def _bucket() -> tuple[torch.Tensor, list]:
    """A bucket: 0.weight at [0, 64), padding [64, 80) holding the stale values of frozen 1.bias."""
    bucket = torch.empty(80)
    bucket[:64], bucket[64:72], bucket[72:] = WEIGHT, BIAS, 0.0
    return bucket, [(bucket, 0, [("0.weight", "values", 0, 64)])]


def _attribution(layout=None) -> Attribution:
    return Attribution(ContentIndex({"0.weight": WEIGHT, "1.bias": BIAS}), lambda: [], layout)


def test_layout_names_what_the_engine_put_there_and_not_the_stale_padding():
    bucket, regions = _bucket()
    layout = lambda t: owned_ranges(t, iter(regions))  # noqa: E731
    assert _attribution(layout)([bucket]) == (Carried("0.weight", "values", 256),)
    assert _attribution()([bucket]) == (Carried("0.weight", "values", 256), Carried("1.bias", "values", 32))
    # A shard of the bucket (rank 1's half): its ranges in its own elements; padding alone carries nothing.
    assert owned_ranges(bucket[40:], iter(regions)) == [("0.weight", "values", 0, 24)]
    assert _attribution(layout)([bucket[64:]]) == ()


def test_a_tensor_off_the_engines_buffers_keeps_storage_and_content_matching():
    _, regions = _bucket()
    elsewhere = torch.cat([BIAS, torch.zeros(4)])
    assert owned_ranges(elsewhere, iter(regions)) is None
    assert _attribution(lambda t: owned_ranges(t, iter(regions)))([elsewhere]) == (Carried("1.bias", "values", 32),)


@pytest.fixture(scope="module")
def pool():
    # The real engine in a rank pool (~10 s of a worker): the proofs job's (scripts/proofs.sh); the attribution
    # itself is planted above in the test command.
    if PROOF_TIER == "smoke":
        pytest.skip("Megatron-FSDP's real buckets in a rank pool: the proofs job's run (scripts/proofs.sh)")
    pool = RankPool(world_size=2, case_timeout_s=60.0)
    yield pool
    pool.close(graceful=True)


def _frozen_collectives(pool, wrap):
    spec = _spec("dist_megatron_fsdp", "megatron_fsdp", MIDDLE, True, (("zero_dp_strategy", "optim_grads_params"),))
    return next(v for v in verify_dist(spec, pool, {}, wrap=wrap) if v.check == "frozen_collectives")


def test_megatron_fsdp_stale_padding_is_not_taken_for_a_second_gather(pool):
    """Frozen 1.weight and 1.bias (4,224 B) gathered once in forward and once for backward (dgrad flows through
    layer 1) every iteration, the two ranks' shards together: exactly that, with a copy of 1.bias in every trainable
    bucket's padding. Named by content, the stale copy reads as a second gather."""
    verdict = _frozen_collectives(pool, megatron_fsdp_with_stale_padding)
    assert verdict.ok, verdict.message
    assert verdict.figures["frozen_comm_bytes_needed"] == 2 * ITERATIONS * (32 * 32 + 32) * 4, verdict.figures
    assert verdict.figures["frozen_comm_bytes_waste"] == 0
    by_content = _frozen_collectives(pool, megatron_fsdp_stale_by_content)
    assert not by_content.ok and "carried the values of frozen 1.bias (128 B): gathered 2 times in forward" \
        in by_content.message, by_content.message
