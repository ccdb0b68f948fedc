"""Probes: instruments that watch a run without changing it (GEMMs/FLOPs, saved tensors, peak memory)."""
from __future__ import annotations

from te_verify.probes.base import Probe


TE_BACKENDS = ("te_eager", "thunder_te", "torch_compile_te", "torch_compile_te_inductor")
# TE backends under torch.compile: their rows also say what the compiler did with TE (probes.te_compile).
TE_COMPILE_BACKENDS = ("torch_compile_te", "torch_compile_te_inductor")


def default_probes(backend_name: str, follow_copies: bool = False) -> list[Probe]:
    """The waste probes a single-process case runs under, all measuring below the implementation under test.

    Torch-lane backends: GEMMs by role (aten dispatch), saved tensors, peak memory; eager, thunder's torch
    executor and torch.compile all go through aten; `follow_copies` traces copies of site inputs and weights (model
    families: a second copy of a site's input is waste the saved check names by site). TE backends over TE's Python (real or on the tex emulation):
    the tex layer's GEMMs by layer and role (probes.tex_gemm) instead of aten's, through aten casts too where
    `follow_copies` (autocast: TE casts weights and inputs with torch ops before the tex GEMM). TE backends over a pure-PyTorch
    --te-impl (the reference, a user's module): aten's GEMMs, and the reference's own GEMM log as a second source
    the checks hold to agree with it. Every TE backend also records warnings; the torch.compile ones what the
    compiler did with TE's modules (probes.te_compile).
    """
    from te_verify.probes.flops import GemmProbe
    from te_verify.probes.memory import PeakMemoryProbe
    from te_verify.probes.saved import SavedTensorsProbe

    if backend_name not in TE_BACKENDS:
        return [GemmProbe(follow_copies=follow_copies), SavedTensorsProbe(), PeakMemoryProbe()]
    from te_verify.te import api as te_api
    from te_verify.probes.warnings import WarningsProbe

    impl = te_api.active()
    if impl.runs_te_python:
        from te_verify.probes.te_compile import TECompileProbe
        from te_verify.probes.tex_gemm import TexGemmProbe

        compiled = [TECompileProbe()] if backend_name in TE_COMPILE_BACKENDS else []
        return [TexGemmProbe(follow_copies), SavedTensorsProbe(), PeakMemoryProbe(), WarningsProbe(), *compiled]
    # An FP8 --te-impl multiplies rounded copies: follow copies back to the weights and activations they came from.
    probes = [GemmProbe(follow_copies=True), SavedTensorsProbe(), PeakMemoryProbe(), WarningsProbe()]
    if impl.kind == te_api.REFERENCE:
        from te_verify.te.reference.gemm_probe import GemmProbe as ReferenceGemmProbe

        probes.append(ReferenceGemmProbe())
    return probes
