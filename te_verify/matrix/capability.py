"""The compute capabilities a TE case runs at on an emulated device: what the main job's capability passes select.

On CPU the capability is the emulation's choice, so the main job runs every TE case where TE serves it: MXFP8, NVFP4
and the custom (MXFP8) recipe need sm100 (TE refuses them below it); FP8 per-tensor and block scaling run at sm90,
and a grouped module under them runs at sm100 too, where TE takes another path (non-TN FP8 GEMMs: no transposed copy
of a weight, input or gradient; fp8_copies judges which copies exist). Everything else runs at sm90, the default.
On a GPU the hardware decides and TE's own check skips a case that needs another capability, saying so.
"""
from __future__ import annotations

from te_verify.spec import CaseSpec

DEFAULT = "sm90"
# Recipes TE serves from sm100 on (TE: "Device compute capability 10.0 or higher required").
SM100_RECIPES = ("mxfp8", "nvfp4", "nvfp4_rn", "custom")
# Recipes whose quantized copies differ at sm90 and sm100 (transposed copies vs non-TN GEMMs).
COPY_PATH_RECIPES = ("delayed", "current", "block")
GROUPED_MODULES = ("grouped_linear", "ops_grouped_linear", "grouped_mlp")


def capabilities(spec: CaseSpec) -> tuple[str, ...]:
    """The emulated capabilities a TE-lane case runs at in the main job (the first is where it runs by default)."""
    te = spec.te
    if te is None:
        return (DEFAULT,)
    if te.recipe in SM100_RECIPES:
        return ("sm100",)
    if te.recipe in COPY_PATH_RECIPES and te.module in GROUPED_MODULES:
        return (DEFAULT, "sm100")
    return (DEFAULT,)


def runs_at(spec: CaseSpec, capability: str) -> bool:
    """Whether the capability pass `capability` runs this TE-lane case."""
    return capability in capabilities(spec)
