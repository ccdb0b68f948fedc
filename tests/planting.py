"""The one way planted faults are put in place: an attribute replaced by a function of its original for one block."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from te_verify.te import api as te_api


@contextlib.contextmanager
def patched(owner: object, name: str, replacement: Callable) -> Iterator[None]:
    """`owner.name` is `replacement(original)` inside the block, the original again after it (also on a raise)."""
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def loaded_tex() -> object:
    """The tex module TE's Python calls, booted over the active --te-impl, so a test run alone patches the module
    TE reads at each call."""
    te_api.active().api
    return sys.modules["transformer_engine_torch"]
