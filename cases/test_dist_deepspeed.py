"""Distributed lane, training engines: DeepSpeed 0.19.8 ZeRO stages 1-3 (ZeRO-3 with persistence threshold 0 and its default; microbatches) training with SGD, frozen patterns; parameters after every step against eager SGD, state kept per rank."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import deepspeed_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_deepspeed"
LANE = "dist"


def test_dist_deepspeed(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
