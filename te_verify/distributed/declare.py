"""A user's distributed wrapper as a backend of its own: its declaration, loaded from `package.module:attr`.

A declaration is an object (or a class instantiated without arguments) with:
- `name` (str): its rows' backend name and the wrapper part of its case ids;
- `wrap(model, spec) -> Wrapped` (te_verify.distributed.types.Wrapped): wraps the seeded model inside a rank;
- `shards` (bool): whether it shards parameters (all-gathers them for compute). The checks judge each rank's GEMMs
  and the gathered-parameter timeline by it, as they judge FSDP by being FSDP;
- `reshards_after_forward` (bool, optional, default `shards`): whether it frees gathered parameters after forward
  and gathers them again for backward;
- `families` (optional, default every distributed family): the families whose cases it runs.

`--backend package.module:attr` (pytest) and `--wrap package.module:attr` (the torchrun entry) load it. Its cases are
its families' cases with the built-in wrappers' options dropped (they are theirs), under its own name, so neither its
rows nor its expectations (`expectations/<name>.toml`) are ever taken for a built-in wrapper's. Each rank loads it
again by its path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from torch import nn

from te_verify import spec as spec_module
from te_verify.matrix.tiers import dedupe
from te_verify.objects import ObjectPathError, load_path
from te_verify.spec import CaseSpec, DistConfig

# Declared wrappers loaded in this process, by name (the checks read their traits by the case's wrapper name).
REGISTERED: dict[str, "DeclaredWrapper"] = {}


class DeclarationError(ValueError):
    """A declaration that cannot be loaded or declares something wrong; the message names it."""


@functools.lru_cache(maxsize=None)
def load_object(path: str) -> Any:
    """The object at `package.module:attr`, instantiated if it is a class (once per process)."""
    try:
        return load_path(path)
    except ObjectPathError as exc:
        raise DeclarationError(f"{path!r}: {exc}") from None


def is_declaration(obj: Any) -> bool:
    """A wrapper declaration, not a single-process backend (which has `prepare`)."""
    return callable(getattr(obj, "wrap", None)) and not hasattr(obj, "prepare")


@dataclass(frozen=True)
class DeclaredWrapper:
    """What te_verify read from a declaration; plain values, so it travels to the ranks as the case's wrap."""

    # package.module:attr, loaded again in each rank.
    path: str
    # Rows' backend name, case ids' wrapper part.
    name: str
    # Whether it shards parameters.
    shards: bool
    # Whether it gathers again for backward what it gathered for forward.
    reshards_after_forward: bool
    # The distributed families it runs.
    families: tuple[str, ...]

    def __call__(self, model: nn.Module, spec: CaseSpec):
        return load_object(self.path).wrap(model, spec)

    def specs(self, family: str, specs: list[CaseSpec]) -> list[CaseSpec]:
        """`family`'s cases for this wrapper: its cases renamed, the built-in wrappers' options dropped."""
        if family not in self.families:
            return []
        return dedupe([s.replace(dist=DistConfig(self.name, s.dist.world_size)) for s in specs])


# Families a declared wrapper runs only where its `families` names them: dist_accumulation needs its Wrapped.no_sync.
OPT_IN = ("dist_accumulation",)


def _families() -> tuple[str, ...]:
    from te_verify.matrix.dist import FAMILIES

    return tuple(FAMILIES)


def _check(path: str, obj: Any) -> DeclaredWrapper:
    missing = [attr for attr in ("name", "wrap", "shards") if not hasattr(obj, attr)]
    if missing:
        raise DeclarationError(f"{path!r}: not a wrapper declaration, it lacks {', '.join(missing)} "
                               "(README, 'Your own wrapper')")
    name, shards = obj.name, obj.shards
    reshards = getattr(obj, "reshards_after_forward", shards)
    if not isinstance(name, str) or not name or name in spec_module.WRAPPERS or not name.replace("_", "").isalnum():
        raise DeclarationError(f"{path!r}: name={name!r}: a new identifier, not a built-in wrapper's name")
    if not isinstance(shards, bool) or not isinstance(reshards, bool):
        raise DeclarationError(f"{path!r}: shards={shards!r}, reshards_after_forward={reshards!r}: expected booleans")
    families = tuple(getattr(obj, "families", None) or [f for f in _families() if f not in OPT_IN])
    unknown = sorted(set(families) - set(_families()))
    if unknown:
        raise DeclarationError(f"{path!r}: families {unknown} unknown; distributed families are {sorted(_families())}")
    return DeclaredWrapper(path, name, shards, reshards, families)


def declared_wrapper(path: str) -> DeclaredWrapper | None:
    """The declaration at `path`, registered in this process; None where `path` names no declaration (a
    single-process backend, or not a `package.module:attr` at all). A broken declaration raises DeclarationError."""
    try:
        obj = load_object(path) if ":" in path else None
    except DeclarationError:  # not loadable: resolve_backend says so for --backend, in its words
        return None
    if not is_declaration(obj):
        return None
    wrapper = _check(path, obj)
    REGISTERED[wrapper.name] = wrapper
    spec_module.USER_WRAPPERS.add(wrapper.name)
    return wrapper
