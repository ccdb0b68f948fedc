"""Wrap a model per spec.dist, one module per wrapper (DDP, FSDP1, FSDP2, fairscale FSDP, thunder ddp/fsdp), and the
training engines (distributed.engines); runs inside a rank.

Every wrapper yields a `Wrapped` (distributed.types): the callable, the units it wraps (a stack's nn.Linear layers; a
model family's blocks -- sharded wrappers make one FSDP unit per unit, hooks and the timeline act on them), how to read
full gradients after backward (gathered for sharded wrappers), by the parameters' qualified names in the unwrapped
model, and how many bytes of gathered (unsharded) parameter storage each unit holds right now -- the observation
the reshard-timing check uses.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from torch import nn

from te_verify import moved
from te_verify.distributed.engines import engine
from te_verify.distributed.types import WrapperError
from te_verify.distributed.wrappers.ddp import wrap_ddp
from te_verify.distributed.wrappers.fairscale import wrap_fairscale
from te_verify.distributed.wrappers.fsdp import wrap_fsdp1
from te_verify.distributed.wrappers.fsdp2 import wrap_fsdp2
from te_verify.distributed.wrappers.thunder import thunder_unavailable, wrap_thunder
from te_verify.spec import WRAPPERS as ALL_WRAPPERS, CaseSpec

if TYPE_CHECKING:  # not bound at run time: the old `from te_verify.distributed.wrappers import Wrapped` must warn
    from te_verify.distributed.types import Wrapped

WRAPPERS: dict[str, Callable[[nn.Sequential, CaseSpec], Wrapped]] = {
    "ddp": wrap_ddp,
    "fsdp": wrap_fsdp1,
    "fsdp2": wrap_fsdp2,
    "fairscale_fsdp": wrap_fairscale,
    "thunder_ddp": wrap_thunder,
    "thunder_fsdp": wrap_thunder,
}

# Wrappers that need more than torch, and why they cannot run in this environment (None: they can).
UNAVAILABLE: dict[str, Callable[[], str | None]] = {"thunder_ddp": thunder_unavailable, "thunder_fsdp": thunder_unavailable}


def wrapper_unavailable(name: str) -> str | None:
    """Why the built-in wrapper `name` cannot run here (None: it can): its cases skip with the reason."""
    check = UNAVAILABLE.get(name)
    return check() if check is not None else None


def wrap(model: nn.Sequential, spec: CaseSpec) -> Wrapped:
    """The spec's wrapper or training engine around `model`."""
    trainer = engine(spec.dist.wrapper) if spec.dist is not None else None
    if trainer is not None:
        return trainer.wrap(model, spec)
    if spec.dist is None or spec.dist.wrapper not in WRAPPERS:
        raise WrapperError(f"spec.dist={spec.dist!r}: expected a wrapper among {sorted(ALL_WRAPPERS)}")
    return WRAPPERS[spec.dist.wrapper](model, spec)


# The wrapper helpers this package held before the reorganisation (Wrapped, grad_of, ...): importable from here, with
# a DeprecationWarning, for one release (te_verify.moved).
__getattr__ = moved.module_getattr(__name__)
