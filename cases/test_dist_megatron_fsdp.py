"""Distributed lane, training engines: Megatron-FSDP 0.6.1 (strategies no_shard, optim, optim_grads, optim_grads_params; overlap; microbatches) training with SGD, frozen patterns; parameters after every step against eager SGD, state kept per rank."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.engines import megatron_fsdp_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_megatron_fsdp"
LANE = "dist"


def test_dist_megatron_fsdp(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
