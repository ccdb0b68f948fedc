"""Probes: instruments that watch a run without changing it (GEMMs/FLOPs, saved tensors, peak memory)."""
from __future__ import annotations

from te_verify.probes.base import Probe


TE_BACKENDS = ("te_eager", "thunder_te")


def default_probes(backend_name: str) -> list[Probe]:
    """The waste probes a single-process case runs under.

    Torch-lane backends: GEMMs by role (aten dispatch), saved tensors, peak memory; eager, thunder's torch
    executor and torch.compile all go through aten. TE backends: the reference runtime's GEMM log (its GEMMs
    by layer and role), saved tensors, and the counting wrapper around real TE's GEMM entry point (inactive on
    the reference).
    """
    from te_verify.probes.saved import SavedTensorsProbe

    if backend_name in TE_BACKENDS:
        from te_verify.probes.te_gemm import TEGemmProbe
        from te_verify.reference.gemm_probe import GemmProbe as ReferenceGemmProbe

        return [ReferenceGemmProbe(), SavedTensorsProbe(), TEGemmProbe()]
    from te_verify.probes.flops import GemmProbe
    from te_verify.probes.memory import PeakMemoryProbe

    return [GemmProbe(), SavedTensorsProbe(), PeakMemoryProbe()]
