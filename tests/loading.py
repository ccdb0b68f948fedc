"""Loading a file that is no importable module (a script in scripts/, a case file in cases/) as a module."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str, register: bool = False) -> ModuleType:
    """The module executed from `path` under `name`; `register` puts it in sys.modules first (a script whose
    dataclasses or pickling look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
