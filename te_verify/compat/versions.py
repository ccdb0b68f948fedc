"""The version range each package's compatibility steps and known gaps were measured on (docs/versions.md).

A compatibility step is strict about what it touches (the code it patches must be there, or it raises naming it),
not about the version number: a release outside its measured range runs, and the report header warns
(`unmeasured_versions`), so a user sees which verdicts come from an unmeasured stack instead of being refused.
"""
from __future__ import annotations

import importlib.metadata

from packaging.version import InvalidVersion, Version

# distribution -> (lowest, highest) release measured here, inclusive (docs/versions.md has the runs behind them).
MEASURED: dict[str, tuple[str, str]] = {
    "torch": ("2.13.0", "2.15.0"),  # thunder's lanes: 2.13 only (thunder 0.2.6 does not import on >= 2.14)
    "transformer-engine": ("2.14.0", "2.20.2"),
    "lightning-thunder": ("0.2.5", "0.2.6"),  # thunder_te: 0.2.6 (0.2.5 lacks TransformerEngineTransform)
    "deepspeed": ("0.19.7", "0.19.8"),
    "megatron-core": ("0.16.0", "0.16.1"),
    "megatron-fsdp": ("0.6.0", "0.6.1"),
    "fairscale": ("0.4.12", "0.4.13"),
}


def _release(text: str) -> Version | None:
    try:
        return Version(Version(text).base_version)  # 2.15.0+cu132 -> 2.15.0
    except InvalidVersion:
        return None


def outside(dist: str, version: str) -> str | None:
    """A warning line when `version` of `dist` lies outside its measured range (None inside, or not tracked)."""
    if dist not in MEASURED:
        return None
    low, high = MEASURED[dist]
    release = _release(version)
    if release is None or Version(low) <= release <= Version(high):
        return None
    return f"{dist} {version} is outside the measured {low} to {high}: runs anyway; docs/versions.md"


def unmeasured() -> list[str]:
    """Every installed tracked distribution outside its measured range, as header warnings."""
    lines = []
    for dist in MEASURED:
        try:
            line = outside(dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
        if line:
            lines.append(line)
    return lines
