"""What torch routes a call through besides its own code, by identity (process_state judges it): the modes on the
torch-function and dispatch mode stacks, and torch's callables -- the functions of the `torch` namespace and of
torch.nn.functional, the methods of torch.Tensor and of every nn.Module class in torch.nn.modules. A run that leaves
a mode entered (a tracer that never exits) or a callable replaced (`torch.nn.Linear.forward = ...`, as
monkey-patching libraries do) leaves every later run, the eager reference and the fp64 truth included, computing
through it, all agreeing with each other about a torch that is no longer torch.

Read cheaply: a mode stack is a tuple of its modes; the callables are one shallow copy of each namespace's __dict__
(about 2,900 entries), compared as dicts (C-level, identity first); only a namespace that differs is walked. Judged:
an entry that is a routine or a descriptor (not data such as a lazily added __annotations__), replaced or deleted;
on a class also one added where it shadows an inherited attribute (`Tensor.matmul = ...` shadows TensorBase's; a
stand-in for a method torch removed shadows nothing). Not judged: a library's patch as it loads (a module the run
imported defines the new value), and dynamo's one-time patch of Module.__init__, installed before any snapshot.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterator, NamedTuple

import torch
from torch._dynamo.mutation_guard import install_generation_tagging_init

# An entry absent from a namespace (deleted, or added by the run).
MISSING = object()


def qualified(obj: Any) -> str:
    """A callable as `module.qualname`; anything else as str()."""
    if hasattr(obj, "__qualname__"):
        return f"{getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    return str(obj)


def _module_classes() -> list[type]:
    """Every nn.Module class torch.nn.modules defines (private bases such as _ConvNd included), Module first."""
    found: dict[type, None] = {torch.nn.Module: None}
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.nn.modules"):
            found.update({value: None for value in vars(module).values() if isinstance(value, type)
                          and issubclass(value, torch.nn.Module) and value.__module__.startswith("torch.nn.modules")})
    return list(found)


def _public_name(cls: type) -> str:
    """torch.nn.Linear where torch.nn exports the class, else its defining module's path."""
    return f"torch.nn.{cls.__name__}" if getattr(torch.nn, cls.__name__, None) is cls else qualified(cls)


# torch.compile's first call patches Module.__init__ and __setstate__ for the process (dynamo's generation tagging);
# installed here, before any snapshot, so no run is blamed for torch's own one-time patch nor has it undone.
install_generation_tagging_init()

# (name a message gives it, the namespace): modules first, then classes.
NAMESPACES: tuple[tuple[str, Any], ...] = (
    ("torch", torch), ("torch.nn.functional", torch.nn.functional), ("torch.Tensor", torch.Tensor),
    *((_public_name(cls), cls) for cls in _module_classes()))


class Callables(NamedTuple):
    """torch's callables at one moment."""

    # A shallow copy of every namespace's __dict__, in NAMESPACES order.
    namespaces: tuple[dict, ...]
    # How many modules were loaded: sys.modules keeps the order modules were first imported in, so those past this
    # count are the ones the run imported (a library's import-time patches are not the run's).
    modules: int


def callables() -> Callables:
    return Callables(tuple(dict(vars(namespace)) for _, namespace in NAMESPACES), len(sys.modules))


def _same(was: dict, now: dict) -> bool:
    try:
        return was == now
    except Exception:  # a value whose == does not give a bool (a tensor): walked entry by entry
        return False


def _judged(value: Any) -> bool:
    return value is not MISSING and (callable(value) or hasattr(type(value), "__get__"))


def _shadows(namespace: Any, key: str) -> bool:
    return isinstance(namespace, type) and any(hasattr(base, key) for base in namespace.__mro__[1:])


def _source_file(value: Any) -> str | None:
    code = getattr(value, "__code__", None) or getattr(getattr(value, "__func__", None), "__code__", None)
    return code.co_filename if code is not None else None


def _imported(before: Callables) -> set[str]:
    """The files of the modules the run loaded."""
    return {getattr(module, "__file__", None) for module in list(sys.modules.values())[before.modules:]} - {None}


def _loaded_from(source: str | None, files: set[str]) -> bool:
    """Whether `source` (a code object's file: relative where te_verify.te.tecpu compiled TE's rewritten source) is one
    of `files`."""
    return source is not None and any(path == source or path.endswith(os.sep + source) for path in files)


def changed_callables(before: Callables, now: Callables) -> Iterator[tuple[str, Any, Any, Any, str]]:
    """(namespace's name, namespace, value before, value now, its key) of every judged entry that changed, except
    where a module the run loaded defines the new value: that library patches torch as it loads (TE's
    Module.float, lightning's torch.compile wrapper), once per process, in whichever run first imports it, and
    would not patch again if undone."""
    imported: set[str] | None = None
    for (name, namespace), was, is_now in zip(NAMESPACES, before.namespaces, now.namespaces):
        if _same(was, is_now):
            continue
        for key in was.keys() | is_now.keys():
            old, new = was.get(key, MISSING), is_now.get(key, MISSING)
            if old is new or not (_judged(old) or (_judged(new) and _shadows(namespace, key))):
                continue
            imported = _imported(before) if imported is None else imported
            if not _loaded_from(_source_file(new), imported):
                yield name, namespace, old, new, key


def callables_left(before: Callables, now: Callables) -> str | None:
    """'left torch.nn.Linear.forward replaced by m.f, torch.Tensor.matmul set to m.g (inherited before)'."""
    changed = [f"{name}.{key} " + ("deleted" if new is MISSING else
                                   f"set to {qualified(new)} (inherited before)" if old is MISSING else
                                   f"replaced by {qualified(new)}")
               for name, _, old, new, key in sorted(changed_callables(before, now), key=lambda c: (c[0], c[4]))]
    return f"left {', '.join(changed)}" if changed else None


def set_callables(before: Callables) -> None:
    """Put back every judged entry that changed: the value it had, or none where the run added it."""
    for _, namespace, old, _, key in list(changed_callables(before, callables())):
        if old is MISSING:
            delattr(namespace, key)
        else:
            setattr(namespace, key, old)


def function_modes() -> tuple:
    """The torch-function mode stack, bottom first (torch.set_default_device's DeviceContext is one)."""
    return tuple(torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack()))


def dispatch_modes() -> tuple:
    """The dispatch mode stack, bottom first: the infra modes (fake, proxy, functional) torch keeps below the user's."""
    return tuple(torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack()))


def _kept_depth(before: tuple, now: tuple) -> int:
    """How many modes at the bottom of the stack are the same objects as before."""
    depth = 0
    while depth < min(len(before), len(now)) and before[depth] is now[depth]:
        depth += 1
    return depth


def stack_left(name: str):
    """(before, now) -> 'left the torch-function mode stack: m.Mode entered, never exited', None where unchanged."""
    def left(before: tuple, now: tuple) -> str | None:
        depth = _kept_depth(before, now)
        changed = ([f"{qualified(type(mode))} entered, never exited" for mode in now[depth:]]
                   + [f"{qualified(type(mode))} exited (entered before the run)" for mode in before[depth:]])
        return f"left the {name} mode stack: {', '.join(changed)}" if changed else None
    return left


def set_function_modes(before: tuple) -> None:
    """Pop the modes above the part of the stack that is as before, then push back what the run popped."""
    depth = _kept_depth(before, function_modes())
    while torch._C._len_torch_function_stack() > depth:
        torch._C._pop_torch_function_stack()
    for mode in before[depth:]:
        torch._C._push_on_torch_function_stack(mode)


def set_dispatch_modes(before: tuple) -> None:
    """As set_function_modes; an infra mode (it has a mode key) goes back to its slot, not onto the user stack."""
    depth = _kept_depth(before, dispatch_modes())
    while torch._C._len_torch_dispatch_stack() > depth:
        torch._C._pop_torch_dispatch_stack(None)
    for mode in before[depth:]:
        if getattr(mode, "_mode_key", None) is not None:
            torch._C._set_dispatch_mode(mode)
        else:
            torch._C._push_on_torch_dispatch_stack(mode)
