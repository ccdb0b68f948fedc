"""Distributed lane: LoRA Llama blocks (frozen base linears, trainable adapters) under DDP, FSDP1, FSDP2 (one unit
per block) and thunder's ddp/fsdp; parity and None-ness against eager, no gradient reduction for frozen
parameters, per-rank site GEMMs."""
from te_verify.distributed.verify import verify_dist
from te_verify.matrix.dist import dist_lora_specs as SPECS  # noqa: F401 -- the plugin parametrizes from SPECS

FAMILY = "dist_lora"
LANE = "dist"


def test_dist_lora(case, rank_pool):
    case.require(verify_dist(case.spec, rank_pool, case.figures))
