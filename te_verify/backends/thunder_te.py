"""thunder_te: thunder.jit of the model with thunder's own TE executor (transformer_engine_ex and
TransformerEngineTransform), run under TE's autocast with the spec's recipe.

The executor calls TE's own Python (te.ops.BasicLinear's functional forward and backward), so it runs wherever
TE's Python runs: real TE on a GPU, or TE's Python over the tex emulation (with the thunder_te_cpu
compatibility step). Under --te-impl reference there is no TE Python to call, so the backend is unavailable.
Which linears thunder's executor actually claimed is measured, not assumed (probes.tex_gemm's
`te_layers_claimed`, checks.te_claims).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from te_verify import device as run_device
from te_verify.te import api as te_api
from te_verify.backends.te_eager import fp8_skip_reason
from te_verify.spec import CaseSpec, TEConfig


# te_verify's limit, not a thunder or TE gap (measured on te_lora's models): thunder's trace rounds RMSNorm and attention
# in bf16 otherwise than eager (up to one ulp, correctly), and NVFP4's E2M1 grid turns that ulp in a quantized operand
# into a whole step (at least 2/7 of the value, above the recipe's rtol 0.25) where it sits at a rounding boundary; the
# same-quantization reference, on eager's roundings, cannot tell such a run from a wrong one (a te_eager with an fp32
# RMSNorm inside fails it alike). Judging it needs a reference that quantizes the backend's own operands per site.
NVFP4_BF16_MODELS = ("te_verify cannot judge NVFP4 over a bf16 model under thunder: its bf16 norm and attention "
                     "round otherwise than eager's (one ulp, correctly), which E2M1 turns into a whole step at a "
                     "quantized site; the same-quantization reference follows eager's roundings")


class ThunderTEBackend:
    """thunder.jit + thunder's TE executor over the active --te-impl's TE (te_api.active())."""

    name = "thunder_te"
    lane = "te"
    # Its executor runs te.ops' BasicLinear functional forward/backward, whose FP8 GEMMs add an fp32 bias as it is
    # (te_case.runs_te_ops: the FP8 reference models that).
    te_ops_linears = True

    def __init__(self, executors: Callable[[], Sequence] | None = None,
                 transforms: Callable[[], Sequence] | None = None) -> None:
        # Factories of stand-in TE executors and their transforms (tests plant a fixed one); default: thunder's own.
        self.executors, self.transforms = executors, transforms

    @property
    def impl(self) -> te_api.TEImpl:
        """The active --te-impl, read at use (the plugin may activate it after constructing backends)."""
        return te_api.active()

    def available(self) -> tuple[bool, str]:
        if not self.impl.runs_te_python:
            return False, (f"thunder's transformer_engine_ex calls TE's own Python (te.ops.BasicLinear); "
                           f"--te-impl {self.impl.name} serves none")
        reason = te_api.device_reason(self.impl, run_device.active())
        if reason:
            return False, reason
        try:
            self._thunder_executor()
        except ImportError as exc:
            return False, str(exc)
        return True, ""

    def unsupported_reason(self, spec: CaseSpec) -> str | None:
        """Why this backend cannot run `spec` (None if it can). Recipes are not filtered here: whether thunder's
        executor claims a linear under a recipe is measured on the run."""
        te = spec.te or TEConfig()
        if te.module != "linear":
            return f"thunder's TE executor claims only linear layers, not {te.module}"
        if te.main_grad or te.delay_wgrad:
            return "thunder's TE executor has no fuse_wgrad_accumulation / delay_wgrad_compute"
        if spec.recompute != "none":  # the TE lane's recompute cases run on te_eager (docs/recompute.md)
            return "activation recompute under thunder's TE executor is not built yet (issue 34: te_eager only)"
        if spec.model is not None and spec.dtype == "bf16" and (te.recipe or "").startswith("nvfp4"):
            return NVFP4_BF16_MODELS
        return fp8_skip_reason(spec, self.impl)

    def _thunder_executor(self):
        from te_verify.compat.thunder import import_thunder

        thunder = import_thunder()
        if self.executors is not None:
            return thunder, list(self.executors()), list(self.transforms() if self.transforms else [])
        from thunder.executors.transformer_engineex import TransformerEngineTransform, transformer_engine_ex

        if transformer_engine_ex is None:
            raise ImportError("thunder found no transformer_engine package (transformer_engine_ex is None)")
        return thunder, [transformer_engine_ex], [TransformerEngineTransform()]

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        thunder, executors, transforms = self._thunder_executor()
        jitted = thunder.jit(model, executors=[*executors, *thunder.get_default_executors()], transforms=transforms)
        api = self.impl.api
        te = spec.te or TEConfig()
        recipe = te_api.case_recipe(api, te)

        def run(x: torch.Tensor) -> torch.Tensor:
            # No recipe: thunder is called outside autocast, as a te_eager run without FP8 would be.
            if recipe is None:
                return jitted(x)
            with api.autocast(enabled=True, recipe=recipe):
                return jitted(x)

        run.__wrapped__ = jitted  # the jitted module, for trace inspection and compilation counts
        return run
