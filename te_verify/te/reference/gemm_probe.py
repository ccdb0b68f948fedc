"""A probe that collects the reference's own GEMM log into Record.observations["reference_gemm_log"] and
["te_saved"]: a self-report the checks compare with the GEMMs measured below it (aten), never one they trust."""
from __future__ import annotations

from typing import Any

from te_verify.te.reference import gemm_log


class GemmProbe:
    """Counts GEMMs by role and FLOPs; raw events go to observations for the checks."""

    name = "gemm_log"

    def __init__(self) -> None:
        self.log = gemm_log.GemmLog()
        self._ctx = None

    def again(self) -> "GemmProbe":
        """A fresh log for a later iteration."""
        return GemmProbe()

    def __enter__(self) -> "GemmProbe":
        self._ctx = gemm_log.collecting(self.log)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(None, None, None)

    def phase(self, name: str, index: int = 0) -> None:
        self.log.phase = f"{name}{index}" if index else name

    def figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = {f"gemms_{role}": sum(e.role == role for e in self.log.gemms) for role in gemm_log.ROLES}
        figures["gemm_flops"] = sum(e.flops for e in self.log.gemms)
        figures["te_saved_bytes"] = sum(e.bytes for e in self.log.saved)
        return figures

    def observations(self) -> dict[str, Any]:
        return {"reference_gemm_log": list(self.log.gemms), "te_saved": list(self.log.saved)}
