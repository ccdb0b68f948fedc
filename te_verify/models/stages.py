"""The model families' freezing rule, one for all: a parameter trains or not by its stage and its block.

A family names each parameter's stage ("embedding", "head", "norms" as ModelConfig.frozen spells them; "adapter"
for a LoRA matrix; "linear" for any other projection weight; "unused" for a parameter the case's forward never
reads) and its block (None outside the blocks); its `trainable(name, cfg)` is `rule` on them, and `set_frozen`
applies that by qualified name (the distributed lane applies it by the names parameters had before wrapping).
A freeze schedule (CaseSpec.schedule) changes what trains by groups of parameters (`group_of`: a stage, or a block's
norms, projections or adapters): `changed` says what each change makes of the groups in force, `trains_at` folds a
spec's changes, and ModelConfig.trains carries the result to the rule (models.schedule.spec_at).
"""
from __future__ import annotations

from typing import Callable

import torch

from te_verify.spec import BLOCK_GROUPS, STAGES, CaseSpec, ModelConfig


def rule(stage: str, block: int | None, cfg: ModelConfig) -> bool:
    """Frozen: the first `frozen_blocks` blocks whole, the stages in `frozen`, unused parameters, and with adapters
    (PEFT) every projection's own weight; everything else trains. `cfg.trains`, where set, names what trains instead."""
    if cfg.trains is not None:
        return group_of(stage, block) in cfg.trains
    if block is not None and block < cfg.frozen_blocks:
        return False
    if stage in STAGES:
        return stage not in cfg.frozen
    return stage == "adapter" or (stage == "linear" and not cfg.lora_on)


def set_frozen(model: torch.nn.Module, cfg: ModelConfig, trainable: Callable[[str, ModelConfig], bool]) -> None:
    """requires_grad of every parameter by the family's `trainable(qualified name, cfg)`."""
    for name, p in model.named_parameters():
        p.requires_grad_(trainable(name, cfg))


def block_of(name: str, prefix: str) -> int | None:
    """The block index after `prefix` in a qualified name ("blocks." in "blocks.3.attn.q.weight" gives 3)."""
    at = name.find(prefix)
    if at < 0:
        return None
    return int(name[at + len(prefix):].split(".", 1)[0])


def group_of(stage: str, block: int | None) -> str:
    """The group (ModelConfig.trains) of a parameter of `stage` in `block`: "<stage>.<block>", or the stage alone."""
    return stage if block is None else f"{stage}.{block}"


def groups(cfg: ModelConfig) -> tuple[str, ...]:
    """Every group a family's forward reads (the stages it has, each block's norms, projections and adapters; the
    headless model's final norm is the blockless "norms"); an "unused" parameter is in none, so it never trains."""
    stages = [s for s, has in (("embedding", cfg.embedding), ("head", cfg.head), ("norms", not cfg.head)) if has]
    per_block = [g for g in BLOCK_GROUPS if g != "adapter" or cfg.lora_on]
    return tuple(stages + [f"{g}.{b}" for b in range(cfg.blocks) for g in per_block])


def changed(change: str, trains: tuple[str, ...], cfg: ModelConfig) -> tuple[str, ...]:
    """A freeze schedule's change (spec.SCHEDULE_CHANGES) to a family's groups training before it: everything; the
    head alone (a frozen backbone under a trained head); the inverse (LoRA's phase switch: adapters frozen, the base
    projections and frozen stages trained); the adapters frozen, the rest as it was. ("bias_only": the families have
    no biases; spec.validate refuses it.)"""
    every = groups(cfg)
    if change == "unfreeze_all":
        return every
    if change == "freeze_all_but_last":
        return ("head",)
    if change == "swap":
        return tuple(g for g in every if g not in trains)
    if change == "freeze_adapters":
        return tuple(g for g in trains if not g.startswith("adapter."))
    raise ValueError(f"schedule change {change!r} is not defined for a model family")


def trains_at(spec: CaseSpec, iteration: int) -> tuple[str, ...]:
    """The groups of `spec.model` training in `iteration` (1-based): the rule's (everything when the spec unfreezes
    after preparing), each change of the schedule up to it folded in."""
    cfg = spec.model
    every = groups(cfg)
    trains = every if spec.freeze_timing == "unfreeze_after" else tuple(
        g for g in every if rule(*_split(g), cfg))
    for k, change in spec.schedule:
        if k <= iteration:
            trains = changed(change, trains, cfg)
    return trains


def _split(group: str) -> tuple[str, int | None]:
    stage, _, block = group.partition(".")
    return stage, (int(block) if block else None)
