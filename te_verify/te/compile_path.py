"""What TE 2.20's torch.compile path needs and where its code says it falls back, from the spec and torch's API alone
(never from TE's report of itself): the table the te_compile_path check holds a torch_compile_te run to.

TE's compile path (module/linear.py, dynamo/custom_op.py) exists for te.Linear only. It needs torch's opaque-object
API (`torch._library.opaque_object.register_custom_class` and `is_opaque_constant_type`, first in torch 2.14); without
it TE disables the path at import and every te.Linear runs eagerly behind a graph break. With it, te.Linear falls back
where the op cannot express the configuration (`_compile_eager_fallback_reason`, `compile_unsupported_reason`):
delayed wgrad compute, fuse_wgrad_accumulation, FP8 weight caching (is_first_microbatch under FP8), and quantizers not
registered as value-opaque (delayed scaling's Float8Quantizer; current scaling, MXFP8, block scaling and NVFP4 are).
"""
from __future__ import annotations

import sys

import torch

from te_verify.spec import CaseSpec, TEConfig
from te_verify.te.api import RECIPE_CLASSES

# torch._library.opaque_object's functions TE 2.20's compile path imports (dynamo/custom_op.py).
TORCH_API = ("register_custom_class", "is_opaque_constant_type")
TORCH_NEEDED = "torch >= 2.14 (torch._library.opaque_object." + " and ".join(TORCH_API) + ")"
# TE's words (module/linear.py) for the fallbacks a spec can ask for.
DELAYED_WGRAD = "delayed wgrad compute (wgrad_store)"
MAIN_GRAD = "fuse_wgrad_accumulation (main_grad)"
WEIGHT_CACHING = "FP8 weight caching (is_first_microbatch)"
NOT_OPAQUE = "a quantizer not registered as a torch.compile value-opaque type"
# TE recipe classes whose quantizers TE registers as value-opaque (tensor/*_tensor.py register_value_opaque_quantizer),
# read through the spec's recipe -> class table, so a recipe name that builds one of them (nvfp4_rn) is one too.
OPAQUE_RECIPE_CLASSES = ("Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling")
# The TE class each non-Linear module kind builds: TE ships no compiled path for them.
NO_PATH = {"grouped_linear": "GroupedLinear", "ops_linear": "te.ops.Linear", "ops_grouped_linear":
           "te.ops.GroupedLinear", "grouped_mlp": "te.ops GroupedMLP", "layernorm_linear": "LayerNormLinear",
           "layernorm_mlp": "LayerNormMLP"}


def torch_missing_api() -> list[str]:
    """The opaque-object functions TE's compile path needs that this torch lacks (empty: it has them)."""
    try:
        import torch._library.opaque_object as opaque
    except ImportError:
        return list(TORCH_API)
    return [name for name in TORCH_API if not hasattr(opaque, name)]


def environment_reason() -> str | None:
    """Why no TE module can take the compiled path in this environment (None: torch has what TE needs)."""
    missing = torch_missing_api()
    if not missing:
        return None
    return (f"environment: torch {torch.__version__} lacks torch._library.opaque_object.{', '.join(missing)}; "
            f"TE's compile path needs {TORCH_NEEDED}")


def support_line() -> str:
    """The report header's line: which torch TE's compile path needs, and whether this run has it."""
    missing = torch_missing_api()
    have = ("has it" if not missing else f"lacks {', '.join(missing)}: TE's modules fall back to eager under "
                                         f"torch.compile (an environment limit, not a TE failure)")
    return f"TE's torch.compile path needs {TORCH_NEEDED}; this run's torch {torch.__version__} {have}"


def te_disabled_reason() -> str | None:
    """TE's own words for why it disabled its compile path in this process (None: it did not, or TE is not loaded)."""
    utils = sys.modules.get("transformer_engine.pytorch.utils")
    return getattr(utils, "_compile_disabled_reason", None)


def expected_fallback(spec: CaseSpec, first_microbatch_passed: bool) -> list[str]:
    """Why TE's code runs this case's TE modules eagerly under torch.compile, environment first; empty where TE's
    compiled path must run. `first_microbatch_passed`: the caller passed is_first_microbatch (True or False)."""
    te = spec.te or TEConfig()
    reasons = [r for r in (environment_reason(),) if r]
    if te.module != "linear":
        reasons.append(f"TE ships no compiled path for {NO_PATH[te.module]} (only te.Linear has one)")
    if te.delay_wgrad:
        reasons.append(DELAYED_WGRAD)
    if te.main_grad:
        reasons.append(MAIN_GRAD)
    if te.recipe is not None and first_microbatch_passed:
        reasons.append(WEIGHT_CACHING)
    if te.recipe is not None and RECIPE_CLASSES.get(te.recipe) not in OPAQUE_RECIPE_CLASSES:
        reasons.append(NOT_OPAQUE)
    return reasons


def compiles_somewhere(spec: CaseSpec) -> bool:
    """Whether TE's code gives this case's modules the compiled path in an environment whose torch has the API
    (the pr tier's torch_compile_te candidates: a fallback runs TE eagerly, which te_eager's cases already judge)."""
    return not [r for r in expected_fallback(spec, first_microbatch_passed=False) if r != environment_reason()]
