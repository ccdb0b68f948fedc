"""Strictness: whatever the emulation does not emulate raises, naming the thing and TE's call site.

A case that reaches an unemulated tex function, triton kernel or torch.cuda call therefore errors; it can
never pass on behaviour nobody wrote.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

TE_PACKAGE = "transformer_engine"


class Unemulated(NotImplementedError):
    """TE reached something the CPU emulation does not provide."""


def te_call_site(skip: int = 1) -> str:
    """The innermost frame in TE's own code: "transformer_engine/pytorch/module/linear.py:412 in _forward"."""
    frame = sys._getframe(skip)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if TE_PACKAGE in path.parts:
            relative = Path(*path.parts[path.parts.index(TE_PACKAGE):])
            return f"{relative.as_posix()}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "outside TE's code"


def refuse(what: str) -> NoReturn:
    raise Unemulated(f"{what} is not emulated on CPU (te_verify.te.tecpu); called from {te_call_site(2)}")


class UnemulatedFunction:
    """Stands in for a function the emulation lacks: importable and inspectable, raising when called."""

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(self.qualname)

    def __repr__(self) -> str:
        return f"<unemulated {self.qualname}>"


def unemulated_class(qualname: str) -> type:
    """A class that TE may name (annotations, isinstance) but cannot instantiate."""

    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(qualname)

    return type(qualname.rsplit(".", 1)[-1], (), {"__init__": __init__, "__module__": qualname.rsplit(".", 1)[0]})
