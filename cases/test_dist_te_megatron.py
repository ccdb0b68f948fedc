"""Distributed lane, training engines: TE's Linear with fuse_wgrad_accumulation under Megatron-core DDP: main_grad against eager's sum over microbatches, the dummy wgrad ignored, frozen TE weights without main_grad; parameters after every step against eager SGD, state kept per rank."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import te_megatron_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_te_megatron"
LANE = "dist"


def test_dist_te_megatron(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
