"""Activation recompute as a factor (CaseSpec.recompute): the freeze patterns of the linear stack and the Llama
family's frozen stages and adapters, each under non-reentrant and reentrant torch.utils.checkpoint, with replays
(every backward pass recomputes). The pr tier draws its handful pairwise (matrix.selection, `recompute` a factor);
nightly runs them all.

Left out, with the reason: a reentrant checkpoint around a block none of whose inputs needs a gradient runs it under
no_grad, so its trainable parameters get no gradient (torch warns "None of the inputs have requires_grad=True.
Gradients will be None", or backward raises where no later block trains): the model then trains something other
than the model it wraps, and users avoid it by making the input need a gradient (or use_reentrant=False).
"""
from __future__ import annotations

from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.matrix.tiers import NON_SQUARE4, SQUARE4, check_tier, dedupe, named_masks
from te_verify.spec import REENTRANT_MODES, CaseSpec, ModelConfig

MODES = ("nonreentrant", "reentrant")


def reentrant_drops_grads(spec: CaseSpec) -> bool:
    """A reentrant checkpoint of a block that trains while its input needs no gradient. Nothing trains before the
    first block that trains, so that happens iff some block trains and the model's input needs no gradient (nor a
    trainable embedding's output). Every stack layer is in a block; a Llama block not frozen whole trains (its
    linears, its adapters or its norms)."""
    if spec.recompute not in REENTRANT_MODES:
        return False
    if spec.model is None:
        weights, biases = spec.frozen_after_prepare()
        return not spec.input_requires_grad and not (all(weights) and (biases is None or all(biases)))
    m = spec.model
    upstream = spec.input_requires_grad or (m.embedding and "embedding" not in m.frozen)
    return m.frozen_blocks < m.blocks and not upstream


def _stack(tier: str) -> list[CaseSpec]:
    patterns = {"smoke": ("alternating",), "pr": ("alternating", "prefix"),
                "nightly": ("alternating", "prefix", "suffix", "none")}[tier]
    widths = (SQUARE4, NON_SQUARE4) if tier == "nightly" else (SQUARE4,)
    specs = [CaseSpec("recompute", w, named_masks(4)[p], named_masks(4)[p], x, (8,), replays=r, recompute=mode)
             for w in widths for p in patterns for x in (False, True) for r in (1, 2) for mode in MODES]
    if tier != "smoke":  # a third block behind two frozen ones: the first two recompute nothing
        dtypes = ("fp32", "bf16") if tier == "nightly" else ("fp32",)
        specs += [CaseSpec("recompute", (16,) * 7, (True,) * 4 + (False,) * 2, None, x, (4, 6), dtype, recompute=mode)
                  for x in (False, True) for dtype in dtypes for mode in MODES]
    return specs


def _llama(tier: str) -> list[CaseSpec]:
    if tier == "smoke":
        return [model_spec("recompute", ModelConfig(blocks=2, frozen_blocks=1), recompute="nonreentrant")]
    configs = [ModelConfig(blocks=2, frozen_blocks=1), ModelConfig(lora_on=LORA_TARGETS["qv"])]
    if tier == "nightly":
        configs += [ModelConfig(), ModelConfig(blocks=2, lora_on=LORA_TARGETS["mlp"], frozen=("norms",)),
                    ModelConfig(embedding=True, head=True, frozen=("head",))]
    return [model_spec("recompute", cfg, x, replays=r, recompute=mode)
            for cfg in configs for x in (False, True) for r in (1, 2) for mode in MODES
            if not (cfg.embedding and x)]


def recompute_specs(tier: str) -> list[CaseSpec]:
    """The recompute family: stack and Llama cases under each checkpoint mode, the reentrant pitfall left out."""
    check_tier(tier)
    return dedupe([s for s in _stack(tier) + _llama(tier) if not reentrant_drops_grads(s)])
