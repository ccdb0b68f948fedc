"""Probes: instruments that watch a run without changing it (GEMMs/FLOPs, saved tensors, peak memory)."""
from __future__ import annotations

from te_verify.probes.base import Probe


TE_BACKENDS = ("te_eager", "thunder_te")


def default_probes(backend_name: str) -> list[Probe]:
    """The waste probes a single-process case runs under.

    Torch-lane backends: GEMMs by role (aten dispatch), saved tensors, peak memory; eager, thunder's torch
    executor and torch.compile all go through aten. TE backends over TE's Python (real or on the tex
    emulation): the tex layer's GEMMs by layer and role (probes.tex_gemm), saved tensors, warnings; over the
    reference: its GEMM log.
    """
    from te_verify.probes.saved import SavedTensorsProbe
    from te_verify.probes.warnings import WarningsProbe

    if backend_name in TE_BACKENDS:
        from te_verify import te_api

        if te_api.active().runs_te_python:
            from te_verify.probes.tex_gemm import TexGemmProbe

            return [TexGemmProbe(), SavedTensorsProbe(), WarningsProbe()]
        from te_verify.reference.gemm_probe import GemmProbe as ReferenceGemmProbe

        return [ReferenceGemmProbe(), SavedTensorsProbe(), WarningsProbe()]
    from te_verify.probes.flops import GemmProbe
    from te_verify.probes.memory import PeakMemoryProbe

    return [GemmProbe(), SavedTensorsProbe(), PeakMemoryProbe()]
