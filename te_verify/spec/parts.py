"""The parts of a CaseSpec: how the TE lane runs it (TEConfig), how the distributed lane wraps it (DistConfig), and a
model family other than the linear stack (ModelConfig)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TEConfig:
    """How the TE lane runs a case (ignored by backends that do not use TE modules)."""

    # FP8 recipe: None (no FP8, high-precision GEMMs), "delayed" (DelayedScaling, amax history), "current"
    # (Float8CurrentScaling), "mxfp8" (MXFP8BlockScaling), "block" (Float8BlockScaling), "nvfp4" (NVFP4BlockScaling,
    # TE's default: gradients rounded stochastically), "nvfp4_rn" (NVFP4BlockScaling without stochastic rounding) or
    # "custom" (CustomRecipe over `qfactory`).
    recipe: str | None = None
    # Which TE construct serves the layers: the Linear module, the GroupedLinear op, the fused grouped MLP, or
    # LayerNormLinear (each layer a layer norm, then the linear: NORM_MODULES).
    module: str = "linear"
    # fuse_wgrad_accumulation: the wgrad GEMM accumulates into param.main_grad instead of returning it.
    main_grad: bool = False
    # The param carries grad_added_to_main_grad (the Megatron protocol): backward returns a dummy wgrad.
    grad_added_to_main_grad: bool = False
    # delay_wgrad_compute: backward queues the wgrad GEMM; backward_dw() runs it.
    delay_wgrad: bool = False
    # Number of microbatches run (forward+backward each) before gradients are read.
    microbatches: int = 1
    # FP8 format of the recipe: "E4M3" (forward tensors and gradients) or "HYBRID" (E4M3 forward, E5M2 gradients).
    fp8_format: str = "E4M3"
    # Layers sharing one weight (tied weights, e.g. embedding and head): the first one's Parameter is used by all.
    tied: tuple[int, ...] = ()
    # Experts per layer (a GroupedLinear of that many groups on equal shares of the rows; MoE); 1 = plain layers.
    experts: int = 1
    # Experts frozen in every layer (on top of weight_frozen): MoE PEFT.
    frozen_experts: tuple[int, ...] = ()
    # DelayedScaling's amax_history_len (TE's default 1024): a short one rolls within a case's iterations.
    amax_history_len: int = 1024
    # CustomRecipe's factory: a name of CUSTOM_FACTORIES (recipe "custom" only).
    qfactory: str = ""
    # Order of the microbatches' passes: "interleaved" (forward, backward, forward, backward) or "forwards_first"
    # (forward, forward, backward, backward); ACCUMULATIONS.
    accumulation: str = "interleaved"
    # The activation between fc1 and fc2 of an MLP module kind (MLP_MODULES; MLP_ACTIVATIONS, TE's default "gelu").
    activation: str = "gelu"

    @property
    def tag(self) -> str:
        parts = [f"fp8{self.recipe}" if self.recipe else "hp"]
        if self.qfactory:
            parts.append(self.qfactory.removesuffix("_factory"))
        if self.module != "linear":
            parts.append(self.module)
        if self.main_grad:
            parts.append("mg" + ("+added" if self.grad_added_to_main_grad else ""))
        if self.delay_wgrad:
            parts.append("dw")
        if self.microbatches > 1:
            parts.append(f"mb{self.microbatches}")
        if self.fp8_format != "E4M3":  # suffix only off the default, so existing ids stay
            parts.append(self.fp8_format.lower())
        if self.tied:
            parts.append("tied" + "_".join(map(str, self.tied)))
        if self.experts > 1:
            parts.append(f"moe{self.experts}" + ("-frozen" + "_".join(map(str, self.frozen_experts))
                                                 if self.frozen_experts else ""))
        if self.amax_history_len != 1024:
            parts.append(f"h{self.amax_history_len}")
        if self.accumulation != "interleaved":  # suffix only off the default, so existing ids stay
            parts.append("fwdfirst")
        if self.activation != "gelu":  # suffix only off the default, so existing ids stay
            parts.append(self.activation)
        return ".".join(parts)


@dataclass(frozen=True)
class DistConfig:
    """How the distributed lane wraps a case."""

    # One of WRAPPERS, or a user's declared wrapper (USER_WRAPPERS).
    wrapper: str
    # Number of ranks; each rank feeds its shard of the global batch.
    world_size: int = 2
    # Wrapper keyword options as sorted (name, value) pairs, so the config stays hashable.
    options: tuple[tuple[str, Any], ...] = ()
    # The wrapper's mixed-precision policy over the spec's fp32 parameters, as users configure it (FSDP1
    # MixedPrecision, FSDP2 MixedPrecisionPolicy): the dtype parameters are cast to for compute (and all-gathered in),
    # and the dtype gradients are reduced in; "" leaves the wrapper's default (no policy). MIXED_PRECISION_DTYPES.
    param_dtype: str = ""
    reduce_dtype: str = ""

    @property
    def tag(self) -> str:
        opts = "".join(f".{k}={v}" for k, v in self.options)
        policy = f".mp{self.param_dtype}" * bool(self.param_dtype) + f".red{self.reduce_dtype}" * bool(self.reduce_dtype)
        return f"{self.wrapper}{opts}.ws{self.world_size}{policy}"  # suffix only off the default: existing ids stay


@dataclass(frozen=True)
class ModelConfig:
    """A model family other than the linear stack (the stack's fields of CaseSpec then go unused)."""

    # Family: a key of MODEL_KINDS, built by te_verify/models/<kind>.py.
    kind: str = "llama"
    # Transformer blocks in sequence.
    blocks: int = 1
    # Embedding width, attention heads (n_embd % n_head == 0) and the SwiGLU MLP's hidden width.
    n_embd: int = 32
    n_head: int = 4
    intermediate: int = 64
    # Projections that carry a LoRA adapter (subset of PROJECTIONS). With any adapter the run is PEFT: every
    # linear's own weight is frozen and only the adapters (and the stages not in `frozen`) train.
    lora_on: tuple[str, ...] = ()
    # LoRA rank r and alpha; the adapter's output is scaled by alpha / r.
    lora_rank: int = 4
    lora_alpha: int = 8
    # The first `frozen_blocks` blocks are frozen whole, adapters included (a frozen stage).
    frozen_blocks: int = 0
    # Token embedding in front (the input is then token ids, which need no grad) and a norm + LM head behind.
    embedding: bool = False
    head: bool = False
    # Vocabulary size for the embedding and the head.
    vocab: int = 48
    # Stages kept frozen (subset of STAGES): "embedding", "head" (its norm and projection), "norms" (the blocks').
    frozen: tuple[str, ...] = ()
    # The adapters' base linears are TE Linear modules (TE lane): LoRA over TE.
    te_base: bool = False
    # The groups of parameters that train (BLOCK_GROUPS' "<stage>.<block>", or a stage of STAGES outside the blocks),
    # overriding the rule of the fields above; None: that rule. What a freeze schedule leaves in force at an iteration
    # (models.schedule.spec_at: the oracle's model of that iteration), or any mix a user trains.
    trains: tuple[str, ...] | None = None

    @property
    def in_width(self) -> int:
        return self.vocab if self.embedding else self.n_embd

    @property
    def out_width(self) -> int:
        return self.vocab if self.head else self.n_embd

    @property
    def tag(self) -> str:
        parts = [f"{self.kind}{self.blocks}", f"d{self.n_embd}.h{self.n_head}.f{self.intermediate}"]
        if self.embedding or self.head:
            parts.append("emb" * self.embedding + "head" * self.head + f"{self.vocab}")
        if self.lora_on:
            parts.append("lora_" + ".".join(self.lora_on) + f".r{self.lora_rank}a{self.lora_alpha}"
                         + ("te" if self.te_base else ""))
        if self.frozen_blocks:
            parts.append(f"fb{self.frozen_blocks}")
        if self.frozen:
            parts.append("fz_" + ".".join(self.frozen))
        if self.trains is not None:  # suffix only off the default, so existing ids stay
            parts.append("tr_" + "+".join(self.trains))
        return "-".join(parts)
