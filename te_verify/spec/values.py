"""The values a spec's fields may take: the allowed sets and defaults, and what each model family's code can express
(KindRules, MODEL_KINDS)."""
from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp32", "bf16")
# CaseSpec.autocast: "" (none) or the dtype torch.autocast runs the step's forward in over the spec's fp32 parameters.
AUTOCASTS = ("", "bf16")
FREEZE_TIMINGS = ("before", "after", "unfreeze_after")
RECIPES = (None, "delayed", "current", "mxfp8", "block", "nvfp4", "nvfp4_rn", "custom")
# TE's CustomRecipe factories (custom_recipes/quantizer_factory_zoo.py) a spec may name; te.reference models each.
CUSTOM_FACTORIES = ("high_precision_fwd_mxfp8_bwd_factory",)
TE_MODULES = ("linear", "grouped_linear", "ops_linear", "ops_grouped_linear", "grouped_mlp", "layernorm_linear",
              "layernorm_mlp")
# TE module kinds whose layers normalize their input first (TE's LayerNormLinear; models.normed is their torch twin).
NORM_MODULES = ("layernorm_linear",)
# TE module kinds that are a layer norm, fc1, an activation and fc2 over a pair of layers (TE's LayerNormMLP;
# models.normed's NormedLinear then ActivatedLinear is their torch twin), and the activations they take (TEConfig
# .activation: TE's names; gelu is TE's default, the tanh approximation).
MLP_MODULES = ("layernorm_mlp",)
MLP_ACTIVATIONS = ("gelu", "relu", "srelu", "qgelu", "silu")
FP8_FORMATS = ("E4M3", "HYBRID")
# How a microbatch iteration orders its passes: each forward followed by its backward, or every forward before any
# backward (several forwards live at once: one module called more than once per step, fairscale PR 1079's order).
ACCUMULATIONS = ("interleaved", "forwards_first")
# Wrappers that compute gradients (one forward and backward per case), then training engines (distributed.engines: one
# file each; their cases take optimizer steps).
WRAPPERS = ("ddp", "fsdp", "fsdp2", "fairscale_fsdp", "thunder_ddp", "thunder_fsdp",
            "megatron_ddp", "megatron_fsdp", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3")
# DistConfig.param_dtype / reduce_dtype: a wrapper's mixed-precision policy ("" = none), and the wrappers that
# take one (distributed.precision builds it for each).
MIXED_PRECISION_DTYPES = ("", "bf16", "fp32")
MIXED_PRECISION_WRAPPERS = ("fsdp", "fsdp2", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "megatron_ddp",
                            "megatron_fsdp")
# Names of users' wrappers declared in this process (te_verify.distributed.declare registers them).
USER_WRAPPERS: set[str] = set()
PROJECTIONS = ("q", "k", "v", "o", "fc_1", "fc_2", "proj")  # a Llama block's linears, attention then MLP
STAGES = ("embedding", "head", "norms")  # what ModelConfig.frozen may name
# Activation recompute around the model's blocks (te_verify.models.recompute): none; torch.utils.checkpoint without
# and with reentrant autograd; in the TE lane also TE's own transformer_engine.pytorch.distributed.checkpoint, with
# TE's default use_reentrant=True ("te") and use_reentrant=False ("te_nonreentrant"); in the distributed lane also an
# engine's own checkpoint function, named after the engine ("deepspeed": deepspeed.checkpointing.checkpoint;
# "megatron": megatron.core.tensor_parallel.checkpoint).
RECOMPUTE_MODES = ("none", "nonreentrant", "reentrant", "te", "te_nonreentrant", "deepspeed", "megatron")
TE_RECOMPUTE_MODES = ("te", "te_nonreentrant")
# An engine's checkpoint mode -> the wrappers that run it (the rest of a rank's model, eager's reference and the fp64
# truth run torch's checkpoint of the same reentrancy in its place).
ENGINE_RECOMPUTE_MODES = {"deepspeed": ("deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3"),
                          "megatron": ("megatron_ddp",)}
REENTRANT_MODES = ("reentrant", "te", "deepspeed", "megatron")  # the modes checkpointing with reentrant autograd
# Training iterations a case runs unless it says otherwise: the third is the first that runs on parameters two
# optimizer steps moved and on FP8 scales two updates produced.
ITERATIONS = 3
# Changes a freeze schedule (CaseSpec.schedule) can make to the trainable set between iterations, on the stack's
# layers: every parameter trainable; every layer frozen but the last (a frozen backbone under a trained head); the
# inverse of the masks in force (LoRA-style phase switch); the weights frozen and the biases trainable (BitFit); the
# adapters frozen, the rest as in force (a model family's LoRA phase ends). A model family's meaning of each is
# models.stages.changed.
SCHEDULE_CHANGES = ("unfreeze_all", "freeze_all_but_last", "swap", "bias_only", "freeze_adapters")
# Model families a freeze schedule is built for (the torch lane; models.stages.changed says what a change does to
# their groups of parameters).
SCHEDULE_KINDS = ("llama", "hf_peft", "litgpt_lora")
# ModelConfig.trains: a group of parameters is a stage outside the blocks, or a block's "norms", "linear" (the
# projections' own weights) or "adapter" (LoRA matrices) as "<stage>.<block>" (models.stages.group_of).
BLOCK_GROUPS = ("norms", "linear", "adapter")


@dataclass(frozen=True)
class KindRules:
    """What a model family's code can express; its module (te_verify/models/<kind>.py) builds every ModelConfig
    these admit. Declared here, beside the fields they constrain, so a spec is validated without importing it."""

    # It takes hidden states (model.embedding False) as well as token ids, and runs without its LM head.
    hidden_input: bool = True
    headless: bool = True
    # Projections that carry adapters together or not at all (LitGPT's one lora_mlp flag covers the whole MLP).
    lora_groups: tuple[tuple[str, ...], ...] = ()
    # Frozen blocks keep their (frozen) adapters; False: they have none (PEFT's layers_to_transform), so with
    # adapters at least one block must stay unfrozen.
    adapters_in_frozen_blocks: bool = True


# Model families beyond the linear stack: ModelConfig.kind -> what its module (te_verify/models/<kind>.py) builds.
MODEL_KINDS = {
    "llama": KindRules(),  # our own Llama blocks, written in LitGPT's style
    "hf_peft": KindRules(adapters_in_frozen_blocks=False),  # transformers' Llama under peft's LoRA
    "litgpt_lora": KindRules(hidden_input=False, headless=False,  # litgpt.lora.GPT: token ids in, logits out
                             lora_groups=(("fc_1", "fc_2", "proj"),)),
}
