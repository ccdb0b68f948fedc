"""A disk cache of TE's rewritten modules (te_verify.te.tecpu.rewrite).

Parsing, rewriting and compiling TE's ~126 modules is about half of booting TE over the emulation (1.6 of 3 s), and
every process that boots TE pays it: the controller (the report header), each xdist worker, each rank of a pool that
imports megatron-core; about 16 boots in one shard of the main job. An entry is keyed by everything the compiled code
depends on: the module's source bytes, the file name the code records, the rewriter's own source (its rules), and the
interpreter (marshal's format and the compiler). It holds the code object and the rewrite sites the rewriter
recorded, which a hit appends to the log as a miss would, so the header's counts are the same either way. An entry
that cannot be read is rewritten; one that cannot be written is skipped (the cache only saves time).
`TE_VERIFY_CACHE` names another folder than ~/.cache/te_verify.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Callable

Site = tuple[str, int, str]


def _folder() -> Path | None:
    """The cache's folder; None (no cache) where there is no home folder to keep it in: code is never loaded from a
    folder other users could write (a shared temporary folder)."""
    if os.environ.get("TE_VERIFY_CACHE"):
        return Path(os.environ["TE_VERIFY_CACHE"]) / "tecpu"
    try:
        return Path.home() / ".cache" / "te_verify" / "tecpu"
    except RuntimeError:
        return None


CACHE = _folder()


def entry_key(source: bytes, filename: str, rules: str) -> str:
    """The entry of one module: its source, its recorded file name, the rules' version, this interpreter."""
    digest = hashlib.sha256()
    for part in (rules.encode(), sys.version.encode(), filename.encode(), source):
        digest.update(len(part).to_bytes(8, "big") + part)  # length-prefixed: no two key parts run together
    return digest.hexdigest()


def load_or_rewrite(source: bytes, filename: str, rules: str, sites: list[Site],
                    rewrite: Callable[[list[Site]], types.CodeType]) -> types.CodeType:
    """The module's rewritten code, from the cache or from `rewrite(new_sites)` (then stored); its sites appended
    to `sites`."""
    path = CACHE / f"{entry_key(source, filename, rules)}.bin" if CACHE is not None else None
    entry = _read(path) if path is not None else None
    if entry is None:
        recorded: list[Site] = []
        code = rewrite(recorded)
        if path is not None:
            _store(path, marshal.dumps((tuple(map(tuple, recorded)), code)))
    else:
        recorded, code = entry
    sites.extend(tuple(site) for site in recorded)
    return code


def _read(path: Path) -> tuple | None:
    """An entry's (sites, code); None where there is none or it cannot be read."""
    try:
        recorded, code = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return recorded, code


def _store(path: Path, data: bytes) -> None:
    """Write atomically (another process may boot TE at the same time); a folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:
            handle.write(data)
        os.replace(handle.name, path)
    except OSError:
        pass
