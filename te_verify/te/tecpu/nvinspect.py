"""TE's debug features, loaded by nvidia-dlframework-inspect (nvdlfw_inspect), rewritten like the rest of TE's source.

TE's precision-debugging tools (`transformer_engine.debug`) hand nvdlfw_inspect a features directory
(transformer_engine/debug/features); its DebugManager loads every .py file there by path
(`utils.import_and_exec_module`: `importlib.util.spec_from_file_location`), outside the import system, so
rewrite.TEFinder never sees them and their CUDA touch points (`assert tensor.is_cuda`,
`torch.cuda.get_device_capability()`) met CPU torch as written. The compatibility step: once
`nvdlfw_inspect.debug_manager` has executed, its `import_and_exec_module` loads a file inside TE's installed package
through the rewriting loader, with nvdlfw_inspect's own conventions (module named after the file, `__package__` the
directory's name, the directory on sys.path while it executes); any other file (nvdlfw_inspect's generic features, a
user's) loads as before. Measured on nvdlfw_inspect 0.2.2; another version's TE files are refused, naming it.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import types
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from te_verify.te.tecpu import rewrite
from te_verify.te.tecpu.strict import refuse

MODULE = "nvdlfw_inspect.debug_manager"
MEASURED = SpecifierSet(">=0.2,<0.3")  # the releases whose DebugManager loads feature files as described above


def patch(debug_manager: types.ModuleType) -> None:
    """Route the DebugManager's file loading of TE's features through the rewriting loader."""
    original = debug_manager.import_and_exec_module
    if getattr(original, "__wrapped__", None) is not None:
        return  # patched already (the module was in sys.modules at boot and is seen again)
    te_root = os.path.realpath(os.path.dirname(importlib.util.find_spec("transformer_engine").origin))
    load = functools.partial(_load, original=original, te_root=te_root, version=_version())
    debug_manager.import_and_exec_module = functools.update_wrapper(load, original)


def _version() -> str:
    return importlib.metadata.version("nvdlfw_inspect")


def _load(module_path: str, *, original: Callable[[str], None], te_root: str, version: str) -> None:
    path = os.path.realpath(module_path)
    if os.path.commonpath([path, te_root]) != te_root:
        original(module_path)
        return
    if Version(version) not in MEASURED:
        refuse(f"TE's debug feature {os.path.basename(path)} loaded by nvdlfw_inspect {version} "
               f"(the emulation's loading is measured on {MEASURED})")
    directory = os.path.dirname(path)
    spec = rewrite.installed_finder().spec_for_file(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = os.path.basename(directory)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(directory)
