"""Activation recompute in the distributed lane (CaseSpec.recompute with dist): every rank builds the stack with each
pair of layers under torch's checkpoint (models.recompute, the model the torch lane checkpoints) and the wrapper or
engine wraps that model; each rank's GEMMs and saved bytes are judged against the recompute oracle of its shard.

Cases: the frozen middle layer (its input inside the first block, its dgrad needed) with the input's gradient, and
the alternating mask (layers 0 and 2 frozen at the blocks' inputs) with and without it: without it the first block's
frozen layer 0 is recomputed in backward for layer 1's wgrad though its dgrad is not needed, so a sharding wrapper
gathers it in backward for the recompute alone. pr: three (DDP reentrant, FSDP2 non-reentrant with the recompute-only
gather, ZeRO-3 non-reentrant); nightly every built wrapper and engine
(spec.RECOMPUTE_WRAPPERS) x mode (torch's two, and DeepSpeed's own checkpoint on its ZeRO stages) x case.

Left out, with the reason:
- matrix.recompute.reentrant_drops_grads: a reentrant block that trains while its input needs no gradient runs under
  no_grad and its parameters get none (the torch lane's rule).
- Reentrant checkpointing on a sharding wrapper where a frozen layer needs its dgrad: the reentrant backward
  differentiates the block's recomputed tensors, so the rank's timeline (distributed.rank.observe: gradient hooks on
  the forward's layer boundaries) does not see that layer's input gradient and reshard_timing cannot be judged
  (inside a block on FSDP1 and FSDP2; at a block's input too on ZeRO-3). So ZeRO-3 with reentrant checkpointing
  (DeepSpeed#7780's configuration, fixed in 0.18.5) runs only where no frozen layer needs its dgrad.
"""
from __future__ import annotations

from te_verify.matrix.dist import MIDDLE, _spec
from te_verify.matrix.recompute import MODES, reentrant_drops_grads
from te_verify.matrix.tiers import check_tier, dedupe, named_masks
from te_verify.spec import ENGINE_RECOMPUTE_MODES, REENTRANT_MODES, CaseSpec

FAMILY = "dist_recompute"
# Each wrapper or engine with the options its other families run it with (spec.RECOMPUTE_WRAPPERS, in order).
WRAPPED = [("ddp", ()), ("fsdp2", (("reshard_after_forward", True),)), ("megatron_ddp", ()), ("deepspeed_zero1", ()),
           ("deepspeed_zero2", ()), ("deepspeed_zero3", (("persistence_threshold", 0),))]
# Wrappers that shard parameters (their reshard timeline is judged).
SHARDING = ("fsdp2", "deepspeed_zero3")
ALTERNATING = named_masks(4)["alternating"]
ALL_TRAINED = (False,) * 4
# Distinct widths: every weight shape names one layer (and the ids share no prefix with other families' expectations).
WIDTHS = (16, 24, 40, 8, 12)


def _case(wrapper: str, options: tuple, mask: tuple[bool, ...], x_grad: bool, mode: str) -> CaseSpec:
    return _spec(FAMILY, wrapper, mask, x_grad, options, WIDTHS).replace(recompute=mode)


def timeline_blind(spec: CaseSpec) -> bool:
    """A reentrant checkpoint on a sharding wrapper with a frozen layer whose dgrad is needed: reshard_timing cannot
    see that layer's input gradient (module docstring; inside a block on FSDP1 and FSDP2, at a block's input too on
    ZeRO-3: "layer 2: no grad_done event for its input", freeze1010 with input grad, measured 2026-11-29)."""
    if spec.recompute not in REENTRANT_MODES or spec.dist.wrapper not in SHARDING:
        return False
    frozen = [k for k, f in enumerate(spec.weight_frozen) if f]
    return any(spec.input_requires_grad or not all(spec.weight_frozen[:k]) for k in frozen)


def _unblind(wrapper: str) -> tuple:
    """ZeRO-3's one case a reentrant checkpoint can run (nothing frozen, the input's gradient: no frozen layer's
    dgrad for the timeline to miss, no block without a gradient): DeepSpeed#7780's configuration."""
    return ((ALL_TRAINED, True),) if wrapper == "deepspeed_zero3" else ()


def _engine_modes(wrapper: str) -> tuple[str, ...]:
    """The engine's own checkpoint modes (spec.ENGINE_RECOMPUTE_MODES) that `wrapper` runs."""
    return tuple(mode for mode, engines in ENGINE_RECOMPUTE_MODES.items() if wrapper in engines)


def dist_recompute_specs(tier: str) -> list[CaseSpec]:
    """pr three cases, nightly every wrapper x mode x (middle with input grad, alternating with and without), less
    what the module docstring leaves out; none in smoke."""
    check_tier(tier)
    if tier == "smoke":
        return []
    options = dict(WRAPPED)
    if tier == "pr":
        return [_case("ddp", options["ddp"], MIDDLE, True, "reentrant"),
                _case("fsdp2", options["fsdp2"], ALTERNATING, False, "nonreentrant"),
                _case("deepspeed_zero3", options["deepspeed_zero3"], ALTERNATING, True, "nonreentrant")]
    specs = [_case(w, opts, mask, x, mode) for w, opts in WRAPPED for mode in MODES + _engine_modes(w)
             for mask, x in ((MIDDLE, True), (ALTERNATING, True), (ALTERNATING, False)) + _unblind(w)]
    return dedupe([s for s in specs if not reentrant_drops_grads(s) and not timeline_blind(s)])
