"""The rules for what a spec's model does: a model family (ModelConfig, its kind's KindRules), a freeze schedule,
activation recompute. te_verify.spec.rules.validate runs them."""
from __future__ import annotations

from te_verify.spec.error import _check
from te_verify.spec.parts import ModelConfig, TEConfig
from te_verify.spec.values import (BLOCK_GROUPS, ENGINE_RECOMPUTE_MODES, MODEL_KINDS, PROJECTIONS, RECOMPUTE_MODES,
                                   SCHEDULE_CHANGES, SCHEDULE_KINDS, STAGES, TE_RECOMPUTE_MODES, KindRules)

# CaseSpec (te_verify.spec.case) is named in annotations only: that module runs validate from __post_init__, so
# importing it here would close an import circle.


def _check_kind(m: ModelConfig, rules: KindRules) -> None:
    _check(rules.hidden_input or m.embedding, f"model.embedding=False: a {m.kind} model takes token ids")
    _check(rules.headless or m.head, f"model.head=False: a {m.kind} model always has its LM head")
    for group in rules.lora_groups:
        _check(len(set(group) & set(m.lora_on)) in (0, len(group)),
               f"model.lora_on={m.lora_on!r}: a {m.kind} model puts adapters on all of {group} or none")
    _check(rules.adapters_in_frozen_blocks or not m.lora_on or m.frozen_blocks < m.blocks,
           f"model.frozen_blocks={m.frozen_blocks}: a {m.kind} model has no adapters in frozen blocks, so one of "
           f"its {m.blocks} blocks must stay unfrozen")


def _check_schedule(spec: CaseSpec) -> None:
    """A freeze schedule: known changes at ascending iterations 2..iterations, on a linear stack (in the TE lane, on
    the modules _check_te_schedule admits)."""
    schedule = spec.schedule
    if not schedule:
        return
    _check(all(isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], int) and c[1] in SCHEDULE_CHANGES
               for c in schedule), f"schedule={schedule!r}: expected (iteration, change) pairs, changes from "
                                   f"{SCHEDULE_CHANGES}")
    at = [k for k, _ in schedule]
    _check(at == sorted(set(at)) and 2 <= at[0] and at[-1] <= spec.iterations,
           f"schedule={schedule!r}: iterations ascending, each in 2..{spec.iterations} (iterations={spec.iterations})")
    if spec.model is not None:
        _check_family_schedule(spec)
        return
    if spec.te is not None:
        _check_te_schedule(spec.te)
    _check(spec.has_bias or all(c != "bias_only" for _, c in schedule),
           f"schedule={schedule!r}: 'bias_only' needs biases (bias_frozen is None)")
    _check(all(c != "freeze_adapters" for _, c in schedule),
           f"schedule={schedule!r}: 'freeze_adapters' needs a model family's adapters (a linear stack has none)")


def _check_family_schedule(spec: CaseSpec) -> None:
    """A freeze schedule on a model family: a torch-lane kind of SCHEDULE_KINDS started from its own rule, and changes
    its model can make (no biases; a head to keep; adapters to freeze)."""
    m, schedule = spec.model, spec.schedule
    _check(m.kind in SCHEDULE_KINDS and not m.te_base and spec.te is None and spec.dist is None,
           f"schedule={schedule!r}: built for the torch lane's {SCHEDULE_KINDS} (model={m.tag}, "
           f"te={spec.te and spec.te.tag}, dist={spec.dist and spec.dist.tag}): the TE and distributed lanes change "
           f"a stack's layers")
    _check(m.trains is None, f"model.trains={m.trains!r}: a freeze schedule starts from the family's rule")
    changes = {c for _, c in schedule}
    _check("bias_only" not in changes, f"schedule={schedule!r}: 'bias_only': a {m.kind} model has no biases")
    _check("freeze_all_but_last" not in changes or m.head,
           f"schedule={schedule!r}: 'freeze_all_but_last' trains the head; model.head is False")
    _check("freeze_adapters" not in changes or m.lora_on,
           f"schedule={schedule!r}: 'freeze_adapters' needs adapters (model.lora_on is empty)")


# TE modules a freeze schedule is built for: one TE module per layer, each holding its layer's own Parameters.
SCHEDULE_TE_MODULES = ("linear", "ops_linear")


def _check_te_schedule(te: TEConfig) -> None:
    """A freeze schedule in the TE lane: per-layer TE modules (their requires_grad flags are the layers'), one
    microbatch per iteration, no main_grad buffers (made at prepare for the weights trainable then)."""
    _check(te.module in SCHEDULE_TE_MODULES,
           f"te.module={te.module!r}: a freeze schedule runs on {SCHEDULE_TE_MODULES} in the TE lane")
    plain = {"microbatches": (te.microbatches, 1), "main_grad": (te.main_grad, False),
             "delay_wgrad": (te.delay_wgrad, False), "tied": (te.tied, ()), "experts": (te.experts, 1)}
    for name, (value, default) in plain.items():
        _check(value == default, f"te.{name}={value!r}: a freeze schedule is not built with it (only {default!r})")


def _check_model(spec: CaseSpec) -> None:
    m = spec.model
    _check(m.kind in MODEL_KINDS, f"model.kind={m.kind!r}: expected one of {tuple(MODEL_KINDS)}")
    _check_kind(m, MODEL_KINDS[m.kind])
    _check(min(m.blocks, m.n_embd, m.n_head, m.intermediate, m.vocab) > 0,
           f"model={m.tag}: blocks, n_embd, n_head, intermediate and vocab must be positive")
    _check(m.n_embd % m.n_head == 0, f"model.n_embd={m.n_embd}: not divisible by model.n_head={m.n_head}")
    _check(set(m.lora_on) <= set(PROJECTIONS) and len(set(m.lora_on)) == len(m.lora_on),
           f"model.lora_on={m.lora_on!r}: expected distinct names from {PROJECTIONS}")
    _check(m.lora_rank > 0, f"model.lora_rank={m.lora_rank!r}: must be positive")
    _check(0 <= m.frozen_blocks <= m.blocks, f"model.frozen_blocks={m.frozen_blocks!r}: between 0 and {m.blocks}")
    _check(set(m.frozen) <= set(STAGES), f"model.frozen={m.frozen!r}: expected names from {STAGES}")
    _check(("embedding" not in m.frozen or m.embedding) and ("head" not in m.frozen or m.head),
           f"model.frozen={m.frozen!r}: names a stage the model does not have")
    _check(not m.te_base or m.lora_on, "model.te_base=True needs adapters (model.lora_on)")
    _check_trains(m)
    _check(spec.widths == (m.in_width, m.out_width),
           f"widths={spec.widths!r}: a {m.kind} model's widths are its (input, output) features, "
           f"{(m.in_width, m.out_width)}")
    _check(spec.weight_frozen == () and spec.bias_frozen is None,
           f"weight_frozen/bias_frozen: a {m.kind} model freezes through model.lora_on/frozen_blocks/frozen")
    _check(len(spec.batch_shape) == 2, f"batch_shape={spec.batch_shape!r}: a {m.kind} model takes (batch, seq)")
    _check(not (m.embedding and spec.input_requires_grad),
           "input_requires_grad=True: token ids (model.embedding) cannot need a gradient")
    _check(spec.te is None or m.te_base, "te: a model family runs on the TE lane only with model.te_base")


def _check_trains(m: ModelConfig) -> None:
    """ModelConfig.trains: None, or distinct groups its model has (BLOCK_GROUPS in a block below model.blocks, a stage
    of STAGES outside the blocks)."""
    if m.trains is None:
        return
    known = {*STAGES, *(f"{g}.{b}" for g in BLOCK_GROUPS for b in range(m.blocks))}
    _check(isinstance(m.trains, tuple) and set(m.trains) <= known and len(set(m.trains)) == len(m.trains),
           f"model.trains={m.trains!r}: expected distinct groups from {sorted(known)}")


def _check_recompute(spec: CaseSpec) -> None:
    _check(spec.recompute in RECOMPUTE_MODES, f"recompute={spec.recompute!r}: expected one of {RECOMPUTE_MODES}")
    _check_te_recompute(spec)
    _check(spec.recompute not in ENGINE_RECOMPUTE_MODES or spec.dist is not None,
           f"recompute={spec.recompute!r}: an engine's own checkpoint needs the distributed lane (dist=None)")
    if spec.dist is not None:
        _check_dist_recompute(spec)
    _check(spec.recompute == "none" or spec.model is None or spec.model.kind == "llama",
           f"recompute={spec.recompute!r}: only the llama family wraps its blocks (model.kind={spec.model and spec.model.kind!r})")


# The wrappers and engines the distributed lane runs with torch's checkpoint around the model's blocks
# (models.recompute, the same checkpointed model every rank builds). Not FSDP1 and fairscale: they compute on views
# of a flat parameter, whose GEMMs the probes cannot name by layer, so a recomputed fprop in backward reads as a dgrad
# (an attribution through those views changed FSDP1's other cases' saved verdicts: not landed, docs/recompute.md).
RECOMPUTE_WRAPPERS = ("ddp", "fsdp2", "megatron_ddp", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3")


def _check_dist_recompute(spec: CaseSpec) -> None:
    """Recompute in the distributed lane: torch's checkpoint modes over a linear stack, under a wrapper or engine it is
    built for (thunder's ddp/fsdp, Megatron-FSDP and users' wrappers are not yet)."""
    if spec.recompute == "none":
        return
    engines = ENGINE_RECOMPUTE_MODES.get(spec.recompute)
    _check(engines is None or spec.dist.wrapper in engines,
           f"recompute={spec.recompute!r}: the engine's own checkpoint runs under {engines}, not "
           f"dist.wrapper={spec.dist.wrapper!r}")
    _check(spec.dist.wrapper in RECOMPUTE_WRAPPERS, f"recompute={spec.recompute!r}: not built for "
           f"dist.wrapper={spec.dist.wrapper!r} (built for {RECOMPUTE_WRAPPERS})")
    _check(spec.recompute not in TE_RECOMPUTE_MODES and spec.te is None and spec.model is None,
           f"recompute={spec.recompute!r}: the distributed lane checkpoints a linear stack of torch Linears only "
           f"(te={spec.te and spec.te.tag}, model={spec.model and spec.model.kind!r})")


def _check_te_recompute(spec: CaseSpec) -> None:
    """The TE lane checkpoints the stack of TE Linears (te_eager's TEStack), not a model family or another module kind;
    TE's checkpoint modes are the TE lane's."""
    _check(spec.recompute not in TE_RECOMPUTE_MODES or spec.te is not None,
           f"recompute={spec.recompute!r}: TE's checkpoint needs the TE lane (te=None)")
    _check(spec.recompute == "none" or spec.te is None or (spec.model is None and spec.te.module == "linear"),
           f"recompute={spec.recompute!r}: the TE lane checkpoints a stack of te.Linear only "
           f"(te={spec.te.tag if spec.te else None}, model={spec.model and spec.model.kind!r})")
