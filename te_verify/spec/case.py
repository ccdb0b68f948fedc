"""CaseSpec: one generated case, checked by the rules (te_verify.spec.rules.validate) as it is made."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from te_verify.spec.parts import DistConfig, ModelConfig, TEConfig
from te_verify.spec.rules import validate
from te_verify.spec.values import ITERATIONS


def _mask(bits: tuple[bool, ...]) -> str:
    return "".join("1" if b else "0" for b in bits)


@dataclass(frozen=True)
class CaseSpec:
    """One generated case. `id` is stable and readable; it is the pytest id and the report key."""

    # Case family (one file under cases/ each); names the report's matrix row.
    family: str
    # Feature widths at every layer boundary: len(widths) == number of layers + 1.
    widths: tuple[int, ...]
    # Per layer: is the weight frozen (requires_grad=False)? Empty for a model family (`model`).
    weight_frozen: tuple[bool, ...]
    # Per layer: is the bias frozen? None means the layers have no bias.
    bias_frozen: tuple[bool, ...] | None = None
    # Does the model input require grad (a trainable upstream, e.g. an embedding)?
    input_requires_grad: bool = False
    # Leading input dims: (batch,) for 2-D inputs, (batch, seq) for 3-D inputs.
    batch_shape: tuple[int, ...] = (8,)
    # Parameter and input dtype: "fp32" or "bf16".
    dtype: str = "fp32"
    # Backward passes over one forward graph; all but the last use retain_graph=True.
    replays: int = 1
    # "before": freeze, then the backend prepares; "after": prepare, then freeze;
    # "unfreeze_after": freeze, prepare, then unfreeze everything (a PEFT schedule step).
    freeze_timing: str = "before"
    # TE lane configuration; None for cases that use plain torch.nn.Linear.
    te: TEConfig | None = None
    # Distributed configuration; None for single-process cases.
    dist: DistConfig | None = None
    # Seed for weights, inputs and the output cotangent; the same for every backend of the case.
    seed: int = 0
    # Plain training steps (forward + backward, no retain_graph, grads then cleared) run before the measured
    # forward: a compiler that specialised its backward on the first step must still honour the replays.
    warmup_steps: int = 0
    # A model family other than the linear stack; None for the stack. Its widths are then (input, output)
    # features and its freezing is the family's (ModelConfig), not weight_frozen/bias_frozen.
    model: ModelConfig | None = None
    # Training iterations (te_verify.training: forward, the backward passes, SGD with momentum), judged after every
    # one: outputs, gradients and parameters. The first is the probed one. A distributed wrapper without an
    # optimizer (DDP, FSDP, ...) takes one step; a training engine takes this many.
    iterations: int = ITERATIONS
    # Activation recompute (one of RECOMPUTE_MODES) around each block: a Llama block, or consecutive pairs of the
    # stack's layers (models.recompute.REGION_LAYERS). Backward recomputes a block's forward from its saved inputs.
    recompute: str = "none"
    # Freeze schedule: (k, change) pairs, k ascending in 2..iterations; before iteration k the training loop applies
    # the named change (SCHEDULE_CHANGES) to the trainable set, in every backend's model and in the reference alike.
    schedule: tuple[tuple[int, str], ...] = ()
    # Mixed precision: "" (none) or "bf16": fp32 parameters and inputs, every forward (every backend's and eager's;
    # not the fp64 truth's) under torch.autocast(dtype=torch.bfloat16), as users train; backward outside it.
    autocast: str = ""
    # Gradient accumulation outside the TE lane (whose own is te.microbatches): microbatches per iteration before the
    # optimizer step. The torch lane runs that many seeded batches (run.microbatch); a distributed wrapper its rank's
    # shard chunked into that many, all but the last under the wrapper's no-sync context (distributed.rank.accumulate).
    microbatches: int = 1
    # Their order (ACCUMULATIONS): each forward followed by its backward, or every forward first.
    accumulation: str = "interleaved"

    def __post_init__(self) -> None:
        validate(self)

    @property
    def n_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def has_bias(self) -> bool:
        return self.bias_frozen is not None

    @property
    def id(self) -> str:
        parts = [self.model.tag] if self.model is not None else self._stack_tag()
        parts.append("x_grad" if self.input_requires_grad else "x_nograd")
        parts.append("in" + "x".join(map(str, self.batch_shape)))
        parts.append(self.dtype)
        if self.autocast:  # suffix only off the default, so existing ids stay
            parts.append(f"ac{self.autocast}")
        parts.append(f"r{self.replays}")
        if self.warmup_steps:
            parts.append(f"wu{self.warmup_steps}")
        if self.iterations != ITERATIONS:  # suffix only off the default, so existing ids stay
            parts.append(f"it{self.iterations}")
        if self.freeze_timing != "before":
            parts.append(self.freeze_timing.replace("_", ""))
        if self.te is not None:
            parts.append(self.te.tag)
        if self.dist is not None:
            parts.append(self.dist.tag)
        if self.seed:
            parts.append(f"s{self.seed}")
        if self.recompute != "none":  # suffix only off the default, so existing ids stay
            parts.append(f"ckpt_{self.recompute}")
        if self.schedule:  # suffix only off the default, so existing ids stay
            parts.append("sched" + "+".join(f"{k}.{change}" for k, change in self.schedule))
        if self.microbatches > 1:  # suffix only off the default, so existing ids stay
            parts.append(f"mb{self.microbatches}" + (".fwdfirst" if self.accumulation != "interleaved" else ""))
        return "-".join(parts)

    def _stack_tag(self) -> list[str]:
        parts = [f"lin{self.n_layers}", "w" + ".".join(map(str, self.widths)), "freeze" + _mask(self.weight_frozen)]
        if not self.has_bias:
            parts.append("nobias")
        elif self.bias_frozen == self.weight_frozen:
            parts.append("bias")
        else:
            parts.append("bias" + _mask(self.bias_frozen))
        return parts

    def frozen_after_prepare(self) -> tuple[tuple[bool, ...], tuple[bool, ...] | None]:
        """The (weight, bias) freeze masks in force when backward runs."""
        if self.freeze_timing == "unfreeze_after":
            none = tuple(False for _ in self.weight_frozen)
            return none, (none if self.has_bias else None)
        return self.weight_frozen, self.bias_frozen

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CaseSpec":
        d = dict(d)
        for key in ("widths", "weight_frozen", "batch_shape"):
            d[key] = tuple(d[key])
        if d.get("bias_frozen") is not None:
            d["bias_frozen"] = tuple(d["bias_frozen"])
        if d.get("te") is not None:
            d["te"] = TEConfig(**{**d["te"], "tied": tuple(d["te"].get("tied", ())),
                                  "frozen_experts": tuple(d["te"].get("frozen_experts", ()))})
        if d.get("model") is not None:
            d["model"] = ModelConfig(**{**d["model"], "lora_on": tuple(d["model"].get("lora_on", ())),
                                        "frozen": tuple(d["model"].get("frozen", ())),
                                        "trains": _tuple_or_none(d["model"].get("trains"))})
        d["schedule"] = tuple(tuple(change) for change in d.get("schedule", ()))
        if d.get("dist") is not None:
            dist = dict(d["dist"])
            dist["options"] = tuple(tuple(o) for o in dist.get("options", ()))
            d["dist"] = DistConfig(**dist)
        return cls(**d)

    def replace(self, **changes: Any) -> "CaseSpec":
        return dataclasses.replace(self, **changes)


def _tuple_or_none(value: Any) -> tuple | None:
    return None if value is None else tuple(value)
