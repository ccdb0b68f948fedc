"""The tex surface of one TE version: its function, class, submodule and enum names, and the enum values.

Generated from the matching `transformer-engine-torch` sdist by scripts/gen_tex_surface.py into
surfaces/tex_<version>.json; the emulation exposes exactly that version's names, so TE code that reaches a
name the real extension lacks fails as it would on a GPU.
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

SURFACES = Path(__file__).parent / "surfaces"


class SurfaceError(ValueError):
    """No surface for the installed TE version; the message names the version and what would work."""


@dataclass(frozen=True)
class Surface:
    """One version's tex names."""

    # The transformer-engine version the sdist belongs to.
    te_version: str
    # The sdist it was generated from (file name and sha256).
    source: str
    # Top-level m.def names.
    functions: tuple[str, ...]
    # py::class_ names.
    classes: tuple[str, ...]
    # Submodule name -> its function names.
    submodules: dict[str, tuple[str, ...]]
    # Enum name -> member -> value.
    enums: dict[str, dict[str, int]]


def available_versions() -> list[str]:
    return sorted(p.stem.removeprefix("tex_") for p in SURFACES.glob("tex_*.json"))


def load(te_version: str) -> Surface:
    path = SURFACES / f"tex_{te_version}.json"
    if not path.exists():
        have = ", ".join(available_versions()) or "none"
        raise SurfaceError(f"TE {te_version}: the tex emulation has no enums for this version (have {have}); "
                           f"generate them with `python scripts/gen_tex_surface.py {te_version}`, "
                           f"or run with --te-impl reference")
    data = json.loads(path.read_text())
    return Surface(data["te_version"], data["source"], tuple(data["functions"]), tuple(data["classes"]),
                   {k: tuple(v) for k, v in data["submodules"].items()}, data["enums"])


@functools.cache
def installed_te_version() -> Version:
    """The installed transformer-engine's version, the one booted (boot refuses without it): what the kernels whose
    binding or definition changed between releases (moe_permute, the fused router, the THD helpers) read."""
    return Version(importlib.metadata.version("transformer_engine"))
