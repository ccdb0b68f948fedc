"""Distributed lane: activation recompute (torch's checkpoint, reentrant or not, around the stack's layer pairs) under
DDP, FSDP1, FSDP2, fairscale FSDP, Megatron-core DDP and DeepSpeed ZeRO 1-3: every rank's gradients, parameters and
collectives as in any case, and its GEMMs and saved bytes against the recompute oracle of its shard (recomputed
fprops at most once per backward pass, never a frozen weight's wgrad, the blocks' inputs saved)."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist_recompute import dist_recompute_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_recompute"
LANE = "dist"


def test_dist_recompute(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
