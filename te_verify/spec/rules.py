"""validate: every rule a spec must pass, naming the first bad field. The TE lane's, the training step's and the
distributed lane's rules are here; a model family's, a freeze schedule's and recompute's in spec.model_rules."""
from __future__ import annotations

from te_verify.spec.error import _check
from te_verify.spec.model_rules import _check_model, _check_recompute, _check_schedule
from te_verify.spec.parts import TEConfig
from te_verify.spec.values import (ACCUMULATIONS, AUTOCASTS, CUSTOM_FACTORIES, DTYPES, FP8_FORMATS, FREEZE_TIMINGS,
                                   MIXED_PRECISION_DTYPES, MIXED_PRECISION_WRAPPERS, MLP_ACTIVATIONS, MLP_MODULES,
                                   RECIPES, TE_MODULES, USER_WRAPPERS, WRAPPERS)

# CaseSpec (te_verify.spec.case) is named in annotations only: that module runs validate from __post_init__, so
# importing it here would close an import circle.


def _check_tied(spec: CaseSpec) -> None:
    tied = spec.te.tied
    if not tied:
        return
    _check(len(tied) >= 2 and all(0 <= i < spec.n_layers for i in tied),
           f"te.tied={tied!r}: expected two or more layer indices below {spec.n_layers}")
    shapes = {(spec.widths[i], spec.widths[i + 1]) for i in tied}
    _check(len(shapes) == 1, f"te.tied={tied!r}: tied layers need one weight shape, widths give {sorted(shapes)}")
    _check(len({spec.weight_frozen[i] for i in tied}) == 1, f"te.tied={tied!r}: tied layers must be frozen alike")


def _check_experts(spec: CaseSpec) -> None:
    te = spec.te
    _check(te.experts >= 1, f"te.experts={te.experts!r}: at least one")
    _check(all(0 <= k < te.experts for k in te.frozen_experts),
           f"te.frozen_experts={te.frozen_experts!r}: expert indices below te.experts={te.experts}")
    if te.experts > 1:
        _check(te.module in ("grouped_linear", "ops_grouped_linear"),
               f"te.experts={te.experts}: experts need a grouped module, not te.module={te.module!r}")
        rows = 1
        for d in spec.batch_shape:
            rows *= d
        _check(rows % te.experts == 0, f"batch_shape={spec.batch_shape!r}: rows must split evenly over {te.experts} experts")


def _check_accumulation(te: TEConfig) -> None:
    _check(te.accumulation in ACCUMULATIONS, f"te.accumulation={te.accumulation!r}: expected one of {ACCUMULATIONS}")
    _check(te.accumulation == "interleaved" or te.microbatches > 1,
           f"te.accumulation={te.accumulation!r} needs te.microbatches > 1 (one microbatch has one order)")


def _check_mlp(spec: CaseSpec) -> None:
    """An MLP module kind (MLP_MODULES) pairs layers: fc1 (hidden -> ffn) then fc2 (ffn -> hidden), so every even
    layer's input width returns after its pair; its activation is one of MLP_ACTIVATIONS (other kinds: the default)."""
    te = spec.te
    _check(te.activation in MLP_ACTIVATIONS, f"te.activation={te.activation!r}: expected one of {MLP_ACTIVATIONS}")
    if te.module not in MLP_MODULES:
        _check(te.activation == "gelu", f"te.activation={te.activation!r}: only an MLP te.module {MLP_MODULES} takes one")
        return
    w = spec.widths
    _check(len(w) % 2 == 1 and all(w[i] == w[i + 2] for i in range(0, len(w) - 2, 2)),
           f"widths={w!r}: te.module={te.module!r} pairs layers hidden -> ffn -> hidden (even layers, widths[2j] == "
           f"widths[2j+2])")


# Wrappers whose microbatches the lane drives (CaseSpec.microbatches); an engine counts its own (dist option
# microbatches).
ACCUMULATING_WRAPPERS = ("ddp", "fsdp", "fsdp2", "fairscale_fsdp")


def _check_microbatches(spec: CaseSpec) -> None:
    """CaseSpec.microbatches/accumulation: the plain training step of a stack, on the torch lane or a wrapper."""
    n, order = spec.microbatches, spec.accumulation
    _check(isinstance(n, int) and n >= 1, f"microbatches={n!r}: at least one")
    _check(order in ACCUMULATIONS, f"accumulation={order!r}: expected one of {ACCUMULATIONS}")
    _check(order == "interleaved" or n > 1,
           f"accumulation={order!r} needs microbatches > 1 (one microbatch has one order)")
    if n == 1:
        return
    _check(spec.te is None, f"microbatches={n}: the TE lane counts te.microbatches (te={spec.te and spec.te.tag})")
    _check(spec.model is None,
           f"microbatches={n}: built for the linear stack, not model.kind={spec.model and spec.model.kind!r}")
    plain = {"replays": (spec.replays, 1), "warmup_steps": (spec.warmup_steps, 0),
             "recompute": (spec.recompute, "none"), "autocast": (spec.autocast, ""), "schedule": (spec.schedule, ())}
    for name, (value, default) in plain.items():
        _check(value == default, f"microbatches={n}: not built with {name}={value!r} (only {default!r})")
    if spec.dist is not None:
        _check(spec.dist.wrapper in ACCUMULATING_WRAPPERS or spec.dist.wrapper in USER_WRAPPERS,
               f"microbatches={n}: dist.wrapper={spec.dist.wrapper!r} is not one of {ACCUMULATING_WRAPPERS} or a "
               f"declared wrapper (an engine takes its own dist option microbatches)")
        _check(spec.batch_shape[0] % (spec.dist.world_size * n) == 0,
               f"batch_shape={spec.batch_shape!r}: batch must split evenly over {spec.dist.world_size} ranks x {n} "
               f"microbatches")



def _check_autocast(spec: CaseSpec) -> None:
    _check(spec.autocast in AUTOCASTS, f"autocast={spec.autocast!r}: expected one of {AUTOCASTS}")
    _check(not spec.autocast or spec.dtype == "fp32",
           f"autocast={spec.autocast!r} needs dtype='fp32' parameters (dtype is {spec.dtype!r})")
    _check(not spec.autocast or spec.dist is None,
           f"autocast={spec.autocast!r}: the distributed lane does not run autocast cases yet (dist is set)")


def validate(spec: CaseSpec) -> None:
    """Raise SpecError naming the first bad field; a spec that passes can be built and run."""
    if spec.model is not None:
        _check_model(spec)
    n = len(spec.widths) - 1
    _check(n >= 1, f"widths={spec.widths!r}: need at least two widths (one layer)")
    _check(all(isinstance(w, int) and w > 0 for w in spec.widths), f"widths={spec.widths!r}: widths must be positive ints")
    _check(spec.model is not None or len(spec.weight_frozen) == n, f"weight_frozen={spec.weight_frozen!r}: expected {n} entries, one per layer")
    if spec.bias_frozen is not None:
        _check(len(spec.bias_frozen) == n, f"bias_frozen={spec.bias_frozen!r}: expected {n} entries, one per layer")
    _check(spec.dtype in DTYPES, f"dtype={spec.dtype!r}: expected one of {DTYPES}")
    _check(spec.replays >= 1, f"replays={spec.replays!r}: at least one backward pass")
    _check(spec.warmup_steps >= 0, f"warmup_steps={spec.warmup_steps!r}: cannot be negative")
    _check(isinstance(spec.iterations, int) and spec.iterations >= 1,
           f"iterations={spec.iterations!r}: at least one training iteration")
    _check_schedule(spec)
    _check(spec.freeze_timing in FREEZE_TIMINGS, f"freeze_timing={spec.freeze_timing!r}: expected one of {FREEZE_TIMINGS}")
    _check(len(spec.batch_shape) in (1, 2) and all(b > 0 for b in spec.batch_shape),
           f"batch_shape={spec.batch_shape!r}: expected (batch,) or (batch, seq) with positive sizes")
    if spec.te is not None:
        _check(spec.te.recipe in RECIPES, f"te.recipe={spec.te.recipe!r}: expected one of {RECIPES}")
        _check(spec.te.module in TE_MODULES, f"te.module={spec.te.module!r}: expected one of {TE_MODULES}")
        _check(spec.te.microbatches >= 1, f"te.microbatches={spec.te.microbatches!r}: at least one")
        _check(spec.te.fp8_format in FP8_FORMATS, f"te.fp8_format={spec.te.fp8_format!r}: expected one of {FP8_FORMATS}")
        _check(spec.te.qfactory in (CUSTOM_FACTORIES if spec.te.recipe == "custom" else ("",)),
               f"te.qfactory={spec.te.qfactory!r}: one of {CUSTOM_FACTORIES} with te.recipe='custom', else unset")
        _check(spec.te.fp8_format == "E4M3" or spec.te.recipe not in (None, "nvfp4", "nvfp4_rn", "custom"),
               f"te.fp8_format={spec.te.fp8_format!r} needs an FP8 te.recipe (recipe is {spec.te.recipe}; NVFP4 "
               f"takes no FP8 format)")
        _check(spec.te.amax_history_len >= 1 and (spec.te.amax_history_len == 1024 or spec.te.recipe == "delayed"),
               f"te.amax_history_len={spec.te.amax_history_len!r}: a positive length, set only for te.recipe='delayed'")
        _check(not spec.te.grad_added_to_main_grad or spec.te.main_grad,
               "te.grad_added_to_main_grad=True needs te.main_grad=True")
        _check_tied(spec)
        _check_experts(spec)
        _check_accumulation(spec.te)
        _check_mlp(spec)
    _check_recompute(spec)
    _check_autocast(spec)
    _check_microbatches(spec)
    if spec.dist is not None:
        _check(spec.dist.wrapper in WRAPPERS or spec.dist.wrapper in USER_WRAPPERS,
               f"dist.wrapper={spec.dist.wrapper!r}: expected one of {WRAPPERS} or a declared wrapper's name")
        _check(spec.dist.world_size >= 1, f"dist.world_size={spec.dist.world_size!r}: at least one rank")
        _check(spec.batch_shape[0] % spec.dist.world_size == 0,
               f"batch_shape={spec.batch_shape!r}: batch must split evenly over {spec.dist.world_size} ranks")
        _check_policy(spec)


def _check_policy(spec: CaseSpec) -> None:
    """A wrapper's mixed-precision policy: known dtypes, a wrapper that takes one, over a stack's fp32 parameters."""
    d = spec.dist
    for field, value in (("param_dtype", d.param_dtype), ("reduce_dtype", d.reduce_dtype)):
        _check(value in MIXED_PRECISION_DTYPES, f"dist.{field}={value!r}: expected one of {MIXED_PRECISION_DTYPES}")
    if not (d.param_dtype or d.reduce_dtype):
        return
    _check(d.wrapper in MIXED_PRECISION_WRAPPERS,
           f"dist.param_dtype/reduce_dtype: wrapper {d.wrapper!r} takes no policy here ({MIXED_PRECISION_WRAPPERS} do)")
    _check(spec.dtype == "fp32" and spec.model is None,
           f"dist.param_dtype={d.param_dtype!r}: a policy over a linear stack's fp32 parameters (dtype={spec.dtype!r}, "
           f"model={spec.model and spec.model.tag!r})")
