"""Distributed lane, training engines: Megatron-core DDP 0.16.1 (grad buffers, main_grad; overlap, bucket size, microbatches) training with SGD, frozen patterns and LoRA blocks; parameters after every step against eager SGD, state kept per rank."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import megatron_ddp_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_megatron_ddp"
LANE = "dist"


def test_dist_megatron_ddp(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
