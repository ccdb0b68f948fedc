"""A strict CPU stand-in for the few `torch.cuda` calls a released engine makes where CPU has a plain meaning.

`confine(module, members, step)` gives one module of a package a `torch` whose `cuda` has only `members` (a device
query answered "cpu", a stream whose ordering CPU program order already gives); every other `torch.cuda` attribute
raises, naming the module and the attribute, so an untested CUDA path fails loudly rather than running as a no-op.
Everything else of `torch` is torch's own. The step string is recorded (compat.APPLIED) for the report header.
"""
from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any, Callable

import torch

from te_verify.compat import record


class CudaPathError(RuntimeError):
    """A CUDA call the stand-in does not cover: the engine took a path no CPU step was written for."""


class NoStream:
    """A CUDA stream on CPU, where ops already run in program order."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> "NoEvent":
        return NoEvent()


class NoEvent:
    """A CUDA event on CPU: recorded work is already done."""

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


STREAM = NoStream()
# The members an engine's step may choose from, by name.
MEMBERS = {
    "current_device": lambda *a, **k: "cpu",
    "Stream": lambda *a, **k: STREAM,
    "current_stream": lambda *a, **k: STREAM,
    "default_stream": lambda *a, **k: STREAM,
    "stream": lambda s=None: contextlib.nullcontext(),
    "Event": lambda *a, **k: NoEvent(),
    "synchronize": lambda *a, **k: None,
    "empty_cache": lambda *a, **k: None,
    "is_available": lambda: False,
}


class StrictCuda(types.SimpleNamespace):
    """`torch.cuda` for one module: the listed members; anything else raises CudaPathError."""

    def __init__(self, owner: str, members: tuple[str, ...], answers: dict[str, Callable] | None = None) -> None:
        super().__init__(**{name: MEMBERS[name] for name in members}, **(answers or {}))
        self._owner = owner

    def __getattr__(self, name: str):
        raise CudaPathError(f"{self._owner} called torch.cuda.{name} on CPU: te_verify's CPU step for it covers only "
                            f"{sorted(k for k in vars(self) if not k.startswith('_'))}")


class TorchProxy(types.ModuleType):
    """`torch` for one module, with a StrictCuda."""

    def __init__(self, owner: str, members: tuple[str, ...], answers: dict[str, Callable] | None = None) -> None:
        super().__init__("torch")
        self.cuda = StrictCuda(owner, members, answers)

    def __getattr__(self, name: str):
        return getattr(torch, name)


def confine(module_name: str, members: tuple[str, ...], step: str,
            answers: dict[str, Callable] | None = None) -> types.ModuleType:
    """Give `module_name` a torch whose cuda is StrictCuda(members, plus `answers`: calls the step answers its own
    way) (once per process); record `step`."""
    module = importlib.import_module(module_name)
    if not isinstance(module.torch, TorchProxy):
        module.torch = TorchProxy(module_name, members, answers)
    record(step)
    return module
