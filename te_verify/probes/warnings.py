"""Warnings raised during a run (e.g. thunder's reason for leaving a linear to torch), for the report row."""
from __future__ import annotations

import warnings
from typing import Any


class WarningsProbe:
    """Records every warning while entered (they are recorded instead of printed)."""

    name = "warnings"

    def __init__(self) -> None:
        self.caught: list[warnings.WarningMessage] = []
        self._ctx: warnings.catch_warnings | None = None

    def __enter__(self) -> "WarningsProbe":
        self._ctx = warnings.catch_warnings(record=True)
        self.caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(None, None, None)

    def phase(self, name: str, index: int = 0) -> None:
        pass

    def messages(self) -> list[str]:
        return sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0][:300]}" for w in self.caught})

    def figures(self) -> dict[str, Any]:
        return {"warnings": self.messages()} if self.caught else {}

    def observations(self) -> dict[str, Any]:
        return {"warnings": self.messages()}
