"""One shared dispatch-mode watcher for the probes: new storages, live bytes, and the layers seen in GEMMs.

Each probe subscribes on enter and unsubscribes on exit; the first subscriber pushes the mode and the last pops
it, so a run with several probes pays for one Python dispatch layer, not one per probe.

Why a dispatch mode and what it sees:
- `ignore_compile_internals()` is True: torch.compile turns the mode off while it traces (FakeTensors) and
  back on for the compiled artifact, so compile-time work is never counted and dynamo does not refuse to
  compile ("non-infra torch dispatch mode present"). thunder traces with proxies, so no torch op runs then.
  Outputs on the meta device or of FakeTensor type are ignored as a second guard.
- Storage identity: every storage first produced by an op during the run gets a serial number (its key);
  storages that existed before (parameters, the model input) are keyed ("pre", data_ptr). Serials never
  alias, unlike data pointers, which the allocator reuses once a storage is freed.
- Phase "idle" (set by a runner around its own snapshots) pauses all of it.
- Layers: a stack of linear layers is a chain, so the k-th distinct parameter used as a GEMM operand in the
  forward phase is the weight of layer k; the other operand of that GEMM is the layer's input.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
GEMM_OPS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm})
StorageKey = Any  # int serial for storages made during the run, ("pre", data_ptr) for older ones


@dataclass
class LayerMap:
    """The layers as seen through forward GEMMs, in forward order."""

    # Storage key of each layer's weight, by layer index.
    weight_keys: list[StorageKey] = field(default_factory=list)
    # Weight shape (out, in) of each layer.
    weight_shapes: list[tuple[int, ...]] = field(default_factory=list)
    # Storage keys of each layer's input (the non-weight operand of its forward GEMMs).
    input_keys: list[set] = field(default_factory=list)
    # 2-D shape of each layer's input as the GEMM saw it.
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)

    def layer_of_weight(self, key: StorageKey) -> int | None:
        return self.weight_keys.index(key) if key in self.weight_keys else None

    def layer_of_input(self, key: StorageKey) -> int | None:
        hits = [i for i, keys in enumerate(self.input_keys) if key in keys]
        return hits[0] if len(hits) == 1 else None

    def unique_layer(self, shapes: list[tuple[int, ...]], shape: tuple[int, ...], transposed_too: bool) -> int | None:
        """The one layer whose listed shape matches `shape` (or its transpose), else None."""
        wanted = {tuple(shape), tuple(reversed(shape))} if transposed_too else {tuple(shape)}
        hits = [i for i, s in enumerate(shapes) if s in wanted]
        return hits[0] if len(hits) == 1 else None


def is_real(t: torch.Tensor) -> bool:
    """False for tensors a compiler traces with (FakeTensor, meta): their work is not the run's."""
    return not isinstance(t, FakeTensor) and t.device.type != "meta"


def _param_of(t: torch.Tensor) -> torch.nn.Parameter | None:
    if isinstance(t, torch.nn.Parameter):
        return t
    return t._base if isinstance(t._base, torch.nn.Parameter) else None


class Watcher(TorchDispatchMode):
    """Tracks new storages (live bytes, peaks) and forward GEMM layers; forwards GEMMs to subscribers."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"  # set by the probes' phase() calls
        self.layers = LayerMap()
        self.gemm_listeners: list[Callable[[Any, tuple, torch.Tensor], None]] = []
        self._live: dict[int, tuple[int, int]] = {}  # data_ptr -> (serial, nbytes) of live new storages
        self._finalizers: list[weakref.finalize] = []
        self._serial = 0
        self.current_bytes = 0
        self.peak_bytes = 0
        self.window_peak_bytes = 0  # peak since the last reset_window()

    def reset_window(self) -> None:
        self.window_peak_bytes = self.current_bytes

    def key(self, t: torch.Tensor) -> StorageKey:
        ptr = t.untyped_storage().data_ptr()
        entry = self._live.get(ptr)
        return entry[0] if entry is not None else ("pre", ptr)

    def is_new(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self._live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.phase == "idle":  # the harness's own work (snapshots of outputs and grads) is not the run's
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor) and is_real(o):
                self._track(o, args)
        if func.overloadpacket in GEMM_OPS and isinstance(out, torch.Tensor) and is_real(out):
            if self.phase == "forward":
                self._learn_layer(args)
            for listener in self.gemm_listeners:
                listener(func, args, out)
        return out

    def _track(self, t: torch.Tensor, args: tuple) -> None:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or ptr in self._live:
            return
        # A view or in-place result of an older tensor shares its storage: not an allocation.
        if any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args):
            return
        self._serial += 1
        nbytes = storage.nbytes()
        self._live[ptr] = (self._serial, nbytes)
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        self.window_peak_bytes = max(self.window_peak_bytes, self.current_bytes)
        self._finalizers.append(weakref.finalize(storage, self._freed, ptr, self._serial))

    def _freed(self, ptr: int, serial: int) -> None:
        entry = self._live.get(ptr)
        if entry is not None and entry[0] == serial:
            del self._live[ptr]
            self.current_bytes -= entry[1]

    def _learn_layer(self, args: tuple) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)][-2:]  # the two GEMM operands
        params = [(i, p) for i, p in enumerate(_param_of(a) for a in tensors) if p is not None and p.dim() == 2]
        if len(params) != 1:
            return
        slot, weight = params[0]
        other = tensors[1 - slot]
        wkey = ("pre", weight.untyped_storage().data_ptr())
        layer = self.layers.layer_of_weight(wkey)
        if layer is None:
            self.layers.weight_keys.append(wkey)
            self.layers.weight_shapes.append(tuple(weight.shape))
            self.layers.input_keys.append(set())
            self.layers.input_shapes.append(tuple(other.shape))
            layer = len(self.layers.weight_keys) - 1
        self.layers.input_keys[layer].add(self.key(other))

    def detach_finalizers(self) -> None:
        """Stop tracking frees once the run is over (the figures are taken)."""
        for fin in self._finalizers:
            fin.detach()
        self._finalizers.clear()


_ACTIVE: list[Watcher] = []  # the running watcher, if any
_SUBSCRIBERS: list[object] = []


def subscribe(probe: object) -> Watcher:
    """Join the shared watcher, pushing it on the dispatch-mode stack if this is the first probe."""
    if not _SUBSCRIBERS:
        watcher = Watcher()
        watcher.__enter__()
        _ACTIVE.append(watcher)
    _SUBSCRIBERS.append(probe)
    return _ACTIVE[-1]


def unsubscribe(probe: object) -> None:
    """Leave the shared watcher; the last probe out pops the mode."""
    _SUBSCRIBERS.remove(probe)
    if not _SUBSCRIBERS:
        watcher = _ACTIVE.pop()
        watcher.__exit__(None, None, None)
        watcher.detach_finalizers()


def set_phase(name: str) -> None:
    if _ACTIVE:
        _ACTIVE[-1].phase = name
