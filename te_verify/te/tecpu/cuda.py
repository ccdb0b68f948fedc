"""The `torch.cuda` TE's rewritten code sees (rule R1 of rewrite.py): one emulated device, the CPU.

Strict: an attribute not listed here raises when TE touches it, naming it and TE's call site. The emulated
compute capability (te_verify.te.tecpu.device) picks TE's code path, as TE reads it from here.
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any

import torch

from te_verify.te.tecpu import device
from te_verify.te.tecpu.strict import refuse


@dataclass(frozen=True)
class DeviceProperties:
    """What TE reads of torch.cuda.get_device_properties: the capability, SM count, memory."""

    major: int
    minor: int
    name: str
    multi_processor_count: int = device.SM_COUNT
    total_memory: int = 80 << 30


class Stream:
    """Work on the emulated device runs in program order, so streams and their waits are no-ops."""

    cuda_stream = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        return event or Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Stream | None = None) -> None:
        pass

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class DeviceContext:
    """torch.cuda.device(d): makes d the current device for a block. The emulated device is the only one (index 0):
    named as TE's tensors name it (their device, the CPU), as "cuda" / "cuda:0" or 0, it selects what is already
    current; None selects nothing, as in torch (index -1). Any other device is refused."""

    EMULATED = (torch.device("cpu"), torch.device("cuda"), torch.device("cuda", 0))

    def __init__(self, device: Any) -> None:
        if device is None or device == -1:
            self.idx = -1
        elif self._is_emulated(device):
            self.idx = 0
        else:
            refuse(f"torch.cuda.device({device!r}) (one emulated device, index 0)")

    @classmethod
    def _is_emulated(cls, device: Any) -> bool:
        return device == 0 if isinstance(device, int) else torch.device(device) in cls.EMULATED

    def __enter__(self) -> "DeviceContext":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class FakeCuda(types.SimpleNamespace):
    """The namespace; unknown attributes raise (strict)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        refuse(f"torch.cuda.{name}")


def _nvtx() -> types.SimpleNamespace:
    return types.SimpleNamespace(range_push=lambda *a, **k: 0, range_pop=lambda *a, **k: 0,
                                 range=lambda *a, **k: contextlib.nullcontext(), mark=lambda *a, **k: None)


def make_cuda() -> FakeCuda:
    """The emulated torch.cuda for the process-wide capability (device.configure)."""
    major, minor = device.capability()
    props = DeviceProperties(major, minor, f"te_verify.te.tecpu emulated {device.capability_name()} (CPU)")
    stream = Stream()
    return FakeCuda(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=lambda device: None,
        get_device_properties=lambda device=None: props,
        get_device_capability=lambda device=None: (major, minor),
        get_device_name=lambda device=None: props.name,
        synchronize=lambda device=None: None,
        current_stream=lambda device=None: stream,
        default_stream=lambda device=None: stream,
        stream=lambda s=None: contextlib.nullcontext(),
        device=DeviceContext,
        Stream=Stream,
        Event=Event,
        is_current_stream_capturing=lambda: False,
        is_bf16_supported=lambda including_emulation=True: True,
        nvtx=_nvtx(),
        empty_cache=lambda: None,
        get_rng_state=lambda device="cuda": torch.get_rng_state(),
        set_rng_state=lambda state, device="cuda": torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,  # one emulated device: "all" is the CPU generator manual_seed seeds
        _lazy_call=lambda fn, **kw: fn(),
        _lazy_init=lambda: None,
    )


def on_emulated_device(t: Any) -> bool:
    """Rule R2: `t.is_cuda` in TE's code is true for tensors on the emulated device."""
    device = getattr(t, "device", None)
    return device is not None and device.type == "cpu"


def off_emulated_device(t: Any) -> bool:
    """Rule R11: `t.is_cpu` in TE's code is false for tensors on the emulated device (the accelerator)."""
    return not on_emulated_device(t)


def to_emulated_device(t: torch.Tensor | torch.nn.Module) -> torch.Tensor | torch.nn.Module:
    """Rule R3: `t.cuda()` in TE's code; the tensor, or every parameter and buffer of the module (`Module.cuda()`,
    as TE's tests call it on TE's modules), must already be on the emulated device."""
    if isinstance(t, torch.nn.Module):
        for name, tensor in [*t.named_parameters(), *t.named_buffers()]:
            if not on_emulated_device(tensor):
                refuse(f"Module.cuda() of a {type(t).__name__} whose {name} is on {tensor.device}")
        return t
    if not on_emulated_device(t):
        refuse(f"Tensor.cuda() of a tensor on {t.device}")
    return t


def make_shim() -> types.SimpleNamespace:
    """The `__tecpu__` global of every rewritten TE module."""
    return types.SimpleNamespace(cuda=make_cuda(), on_emulated_device=on_emulated_device,
                                 off_emulated_device=off_emulated_device, to_emulated_device=to_emulated_device,
                                 cuda_version=device.CUDA_VERSION)
