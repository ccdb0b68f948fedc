"""The probe protocol: an instrument that watches one run without changing its result."""
from __future__ import annotations

from typing import Any, Protocol


class Probe(Protocol):
    """Entered around the whole run (forward and every backward pass).

    The runner calls `phase("forward")` before the forward and `phase("backward", k)` before the k-th
    backward pass. After exit, `figures()` returns JSON-serialisable numbers for the report and
    `observations()` returns raw data for checks (e.g. a list of GEMM events). Work done by a compiler on
    fake or meta tensors while it traces must not be counted.
    """

    name: str

    def __enter__(self) -> "Probe": ...

    def __exit__(self, *exc: object) -> None: ...

    def phase(self, name: str, index: int = 0) -> None: ...

    def figures(self) -> dict[str, Any]: ...

    def observations(self) -> dict[str, Any]: ...
