"""What torch.compile did with a TE backend's callable (backends.torch_compile_te's CompileLog: the graphs Dynamo
compiled and TE's op in them by layer, Dynamo's graph breaks, TE's warnings), for the report row and the
te_compile_path check. Entered around every iteration (spans_iterations); the log itself runs from the first call
on, warm-up included, since Dynamo compiles on the first call whichever it is."""
from __future__ import annotations

from typing import Any


class TECompileProbe:
    """Reads the callable's `te_compile` log; a callable without one gives no figures (the check says so)."""

    name = "te_compile"
    spans_iterations = True

    def __init__(self) -> None:
        self.log = None

    def bind_callable(self, fn: Any) -> None:
        self.log = getattr(fn, "te_compile", None)

    def __enter__(self) -> "TECompileProbe":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def phase(self, name: str, index: int = 0) -> None:
        pass

    def step_done(self, iteration: int) -> None:
        pass

    def figures(self) -> dict[str, Any]:
        return self.log.figures() if self.log is not None else {}

    def observations(self) -> dict[str, Any]:
        return {"te_compile": self.log}
