"""Backend names -> backend objects; external backends load from `package.module:attr`.

Each built-in belongs to a lane: "torch" backends run the plain-PyTorch families, "te" backends the TE
families. External backends join the torch lane unless they set `lane = "te"`. The distributed lane's
"backends" are its wrappers (DIST_WRAPPERS), which run inside the rank pool: naming one in --backend selects its
cases, and a run naming none of them runs no distributed case.
"""
from __future__ import annotations

from typing import Callable

from te_verify.backends.base import Backend
from te_verify.backends.eager import EagerBackend
from te_verify.backends.thunder import ThunderBackend
from te_verify.backends.torch_compile import TorchCompileBackend
from te_verify.spec import WRAPPERS
from te_verify.objects import ObjectPathError, load_path


class BackendError(ValueError):
    """An unknown backend name or a bad `package.module:attr` path."""


# What --backend package.module:attr must name, said in every error about one.
PROTOCOL = ("a backend is an object (or a class made without arguments) with name (str), available() -> (ok, reason) "
            "and prepare(model, spec) -> callable (or a distributed wrapper declaration: name, wrap, shards)")


def _te_eager() -> Backend:
    from te_verify.backends.te_eager import TEEagerBackend

    return TEEagerBackend()


def _torch_compile_te(name: str) -> Callable[[], Backend]:
    def make() -> Backend:
        from te_verify.backends.torch_compile_te import BACKENDS, TorchCompileTEBackend

        return TorchCompileTEBackend(BACKENDS[name])
    return make


def _thunder_te() -> Backend:
    from te_verify.backends.thunder_te import ThunderTEBackend

    return ThunderTEBackend()


BUILTINS: dict[str, tuple[str, Callable[[], Backend]]] = {
    "eager": ("torch", EagerBackend),
    "thunder": ("torch", ThunderBackend),
    "torch_compile": ("torch", TorchCompileBackend),
    "torch_compile_inductor": ("torch", lambda: TorchCompileBackend("inductor")),
    "torch_compile_dynamic": ("torch", lambda: TorchCompileBackend(dynamic=True)),
    "te_eager": ("te", _te_eager),
    "thunder_te": ("te", _thunder_te),
    "torch_compile_te": ("te", _torch_compile_te("torch_compile_te")),
    "torch_compile_te_inductor": ("te", _torch_compile_te("torch_compile_te_inductor")),
}

# The distributed lane's wrappers and training engines (te_verify.spec.WRAPPERS), named there so selecting them needs
# no import of their libraries.
DIST_WRAPPERS = WRAPPERS

# Backends each tier runs when --backend is not given (inductor compiles take ~16 s a case here). torch_compile_te's
# pr share is the cases where TE's code compiles (plugin; a fallback runs TE eagerly, as te_eager's cases do);
# `te-verify run` routes it to the compile environment, where TE's compiled path runs (te_verify.passes). Its
# inductor variant and its nightly tier run in the nightly workflow's torch_compile_te job.
TIER_DEFAULTS: dict[str, tuple[str, ...]] = {
    "smoke": ("eager", "thunder", "torch_compile", "te_eager", "thunder_te", *DIST_WRAPPERS),
    "pr": ("eager", "thunder", "torch_compile", "te_eager", "thunder_te", "torch_compile_te", *DIST_WRAPPERS),
    "nightly": ("eager", "thunder", "torch_compile", "torch_compile_dynamic", "torch_compile_inductor", "te_eager",
                "thunder_te", *DIST_WRAPPERS),
}


def load_external(path: str) -> Backend:
    """`package.module:attr`, where attr is a backend class (instantiated without arguments) or instance."""
    if ":" not in path:
        raise BackendError(f"--backend {path!r}: expected a built-in name ({', '.join(BUILTINS)}) or package.module:attr")
    try:
        backend = load_path(path)
    except ObjectPathError as exc:
        raise BackendError(f"--backend {path!r}: {exc}; {PROTOCOL}") from None
    missing = [a for a in ("available", "prepare") if not callable(getattr(backend, a, None))]
    missing = ([] if isinstance(getattr(backend, "name", None), str) else ["name"]) + missing
    if missing:
        raise BackendError(f"--backend {path!r}: not a backend, it lacks {', '.join(missing)}; {PROTOCOL}")
    return backend


def resolve_backend(name_or_path: str) -> Backend:
    if name_or_path in BUILTINS:
        return BUILTINS[name_or_path][1]()
    if ":" in name_or_path:
        return load_external(name_or_path)
    raise BackendError(f"--backend {name_or_path!r}: unknown backend; built-ins are {', '.join(BUILTINS)}; "
                       f"distributed wrappers are {', '.join(DIST_WRAPPERS)}")


def lane_of(name_or_path: str, backend: Backend) -> str:
    if name_or_path in BUILTINS:
        return BUILTINS[name_or_path][0]
    return getattr(backend, "lane", "torch")
