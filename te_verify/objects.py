"""A user's object named `package.module:attr` (a backend, a wrapper declaration), loaded by the one rule both use."""
from __future__ import annotations

import importlib
from typing import Any


class ObjectPathError(ValueError):
    """A path that does not name a loadable object; the message says why, without the path (callers prefix it)."""


def load_path(path: str) -> Any:
    """The object at `package.module:attr`, instantiated without arguments if it is a class."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ObjectPathError("expected package.module:attr")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 -- whatever the user's module raised on import, said in one line
        raise ObjectPathError(f"cannot load it: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, type):
        return obj
    try:
        return obj()
    except Exception as exc:  # noqa: BLE001 -- a class that needs arguments is not one te_verify can make
        raise ObjectPathError(f"{attr} is a class that cannot be made without arguments "
                              f"({type(exc).__name__}: {exc})") from None
