"""Distributed lane: gradient accumulation under DDP, FSDP1, FSDP2 and fairscale FSDP (issue 34, item 5): each rank's
shard in microbatches, each forward followed by its backward or every forward first, all but the last microbatch's
passes under the wrapper's no-sync context; gradients, outputs, parameters, every rank's GEMMs per microbatch and
the collectives (one reduction per iteration) judged as for one forward and backward."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import accumulation_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_accumulation"
LANE = "dist"


def test_dist_accumulation(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
