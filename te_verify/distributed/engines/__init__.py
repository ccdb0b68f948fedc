"""Training engines under test: each file declares one `Engine` (its wrap, whether it shards, its CPU step), and
ENGINES lists them. An engine trains (distributed.training): the lane runs its optimizer step and judges the
parameters after every step and the state it keeps. Nothing heavy is imported here: an engine's package is
imported inside its wrap, in the rank."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

from te_verify.spec import CaseSpec


@dataclass(frozen=True)
class Engine:
    """One training engine as the lane sees it."""

    # Its backend name, the wrapper part of its case ids (spec.dist.wrapper).
    name: str
    # (seeded model, spec) -> distributed.wrappers.Wrapped with its `train` set; runs inside a rank.
    wrap: Callable
    # spec -> whether it shards parameters (all-gathers them for compute).
    shards: Callable[[CaseSpec], bool]
    # spec -> whether it frees gathered parameters after forward and gathers them again for backward.
    reshards_after_forward: Callable[[CaseSpec], bool]
    # The CPU steps its wrap applies on a CPU rank (compat.cuda_stand_in), for the report header written by the caller.
    cpu_steps: tuple[str, ...] = ()
    # Compatibility steps its wrap applies on every device (listed in the report header too).
    steps: tuple[str, ...] = ()
    # The package it imports (its cases skip, naming it, where it is not installed).
    package: str = ""
    # spec -> gradient reductions per iteration by design: 1, or one per microbatch where the engine keeps only its
    # partition of the gradients (ZeRO-2/3, Megatron-FSDP's gradient-sharding strategies: they must reduce each
    # microbatch's gradients into it, as their documentation says).
    reductions: Callable[[CaseSpec], int] = lambda spec: 1

    def unavailable(self) -> str | None:
        """Why its cases cannot run here (None if they can)."""
        if self.package and importlib.util.find_spec(self.package) is None:
            return f"{self.package} is not installed (README: the install commands)"
        return None


def _engines() -> dict[str, Engine]:
    from te_verify.distributed.engines import deepspeed_zero, megatron_ddp, megatron_fsdp

    return {e.name: e for e in (megatron_ddp.ENGINE, megatron_fsdp.ENGINE, *deepspeed_zero.ENGINES)}


ENGINES: dict[str, Engine] = {}


def engine(name: str) -> Engine | None:
    """The engine called `name`, or None for a wrapper that is not an engine."""
    if not ENGINES:
        ENGINES.update(_engines())
    return ENGINES.get(name)
