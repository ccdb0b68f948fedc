"""The one way planted faults are put in place: an attribute replaced by a function of its original for one block."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def patched(owner: object, name: str, replacement: Callable) -> Iterator[None]:
    """`owner.name` is `replacement(original)` inside the block, the original again after it (also on a raise)."""
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)
