"""thunder_te: thunder.jit of the model with a TE executor, run under the TE impl's autocast.

With the reference (or a reference variant), the executor is ours (te_verify.reference.thunder_executor),
registered through thunder's extension API; with real TE it is thunder's own transformer_engine_ex with
TransformerEngineTransform. `ThunderTEBackend(always_wgrad=True)` uses our executor in upstream mode
(weight gradient always computed, thunder issue 2076).
"""
from __future__ import annotations

import torch

from te_verify import te_api
from te_verify.backends.te_eager import fp8_skip_reason
from te_verify.spec import CaseSpec, TEConfig


class ThunderTEBackend:
    """thunder.jit + TE executor; the executor follows the active --te-impl (te_api.active())."""

    name = "thunder_te"
    lane = "te"

    def __init__(self, always_wgrad: bool = False) -> None:
        self.always_wgrad = always_wgrad

    @property
    def impl(self) -> te_api.TEImpl:
        """The active --te-impl, read at use (the plugin may activate it after constructing backends)."""
        return te_api.active()

    def available(self) -> tuple[bool, str]:
        try:
            from te_verify.compat.thunder_named_tensors import import_thunder

            import_thunder()
        except ImportError as exc:
            return False, str(exc)
        if not self.impl.is_reference_runtime:
            try:
                from thunder.executors.transformer_engineex import transformer_engine_ex
            except ImportError as exc:
                return False, f"thunder's transformer_engine executor does not import: {exc}"
            if transformer_engine_ex is None or not torch.cuda.is_available():
                return False, "thunder's transformer_engine executor needs TE and a CUDA device"
        return True, ""

    def unsupported_reason(self, spec: CaseSpec) -> str | None:
        """Why this backend cannot run `spec` here (None if it can)."""
        te = spec.te or TEConfig()
        if te.module != "linear":
            return f"thunder's TE executor claims only linear, not {te.module}"
        if te.main_grad or te.delay_wgrad:
            return "thunder's TE executor has no fuse_wgrad_accumulation / delay_wgrad_compute"
        if not self.impl.is_reference_runtime and te.recipe == "current":
            return "thunder 0.2.6's transformer_engine_ex does not claim linear under Float8CurrentScaling"
        return fp8_skip_reason(spec, self.impl)

    def _executor_and_transforms(self):
        if self.impl.is_reference_runtime:
            from te_verify.reference.thunder_executor import NeedsGradAnalysis, make_executor

            free = bool(self.impl.api.FREE_SAVED_AFTER_BACKWARD)
            return make_executor(self.always_wgrad, free), [NeedsGradAnalysis()]
        from thunder.executors.transformer_engineex import TransformerEngineTransform, transformer_engine_ex

        return transformer_engine_ex, [TransformerEngineTransform()]

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        from te_verify.compat.thunder_named_tensors import import_thunder

        thunder = import_thunder()
        executor, transforms = self._executor_and_transforms()
        if self.impl.is_reference_runtime:
            from te_verify.reference.thunder_executor import label_layers

            label_layers(model)
        jitted = thunder.jit(model, executors=[executor, *thunder.get_default_executors()], transforms=transforms)
        api = self.impl.api
        te = spec.te or TEConfig()
        recipe = te_api.make_recipe(api, te.recipe, te.fp8_format)

        def run(x: torch.Tensor) -> torch.Tensor:
            with api.autocast(enabled=recipe is not None, recipe=recipe):
                return jitted(x)

        run.__wrapped__ = jitted  # the jitted module, for trace inspection and compilation counts
        return run
