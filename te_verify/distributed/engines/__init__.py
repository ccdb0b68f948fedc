"""Training engines under test: each engine's file declares one `Engine` (distributed.types: its wrap, whether it shards, its CPU
step; gathered.py holds their gathered-parameter probes), and
ENGINES lists them. An engine trains (distributed.rank.training): the lane runs its optimizer step and judges the
parameters after every step and the state it keeps. Nothing heavy is imported here: an engine's package is
imported inside its wrap, in the rank."""
from __future__ import annotations

from te_verify.distributed.types import Engine


def _engines() -> dict[str, Engine]:
    from te_verify.distributed.engines import deepspeed_zero, megatron_ddp, megatron_fsdp

    return {e.name: e for e in (megatron_ddp.ENGINE, megatron_fsdp.ENGINE, *deepspeed_zero.ENGINES)}


ENGINES: dict[str, Engine] = {}


def engine(name: str) -> Engine | None:
    """The engine called `name`, or None for a wrapper that is not an engine."""
    if not ENGINES:
        ENGINES.update(_engines())
    return ENGINES.get(name)
