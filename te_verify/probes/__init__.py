"""Probes: instruments that watch a run without changing it (GEMMs/FLOPs, saved tensors, peak memory)."""
from __future__ import annotations

from te_verify.probes.base import Probe


def default_probes(backend_name: str) -> list[Probe]:
    """The waste probes every single-process case runs under; the same set for every backend, since they
    watch aten ops and autograd saves, which eager, thunder's torch executor and torch.compile all go through."""
    from te_verify.probes.flops import GemmProbe
    from te_verify.probes.memory import PeakMemoryProbe
    from te_verify.probes.saved import SavedTensorsProbe

    probes: list[Probe] = [GemmProbe(), SavedTensorsProbe(), PeakMemoryProbe()]
    if backend_name in ("te_eager", "thunder_te"):
        from te_verify.probes.te_gemm import TEGemmProbe

        probes.append(TEGemmProbe())  # counts real TE's GEMMs by role; inactive on the reference runtime
    return probes
