"""Observers used inside a rank: a collective counter and an unshard/reshard timeline.

The counter patches torch.distributed's collective functions for the duration of a case (the wrappers look
them up on the module at call time) and records each outermost call's kind, bytes and phase. The timeline
snapshots how many bytes of gathered parameter storage every layer holds each time a layer boundary's
gradient is done -- a measurement of storage, not a count of hook calls.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

# Function name -> (kind, position and keyword of the argument holding the full-volume tensor(s)).
COLLECTIVES: dict[str, tuple[str, int, str]] = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "_reduce_scatter_base": ("reduce_scatter", 1, "input"),
    "all_gather": ("all_gather", 0, "tensor_list"),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
    "all_gather_single": ("all_gather", 0, "output_tensor"),
    "_all_gather_base": ("all_gather", 0, "output_tensor"),
    "broadcast": ("broadcast", 0, "tensor"),
}
GRAD_REDUCTIONS = ("all_reduce", "reduce_scatter")


def tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(t) for t in obj)
    return 0


@dataclass
class CollectiveCounter:
    """Counts collectives by kind, bytes and phase while active."""

    # Current phase label ("forward" / "backward"), set by the case runner.
    phase: str = "setup"
    # One (kind, bytes, phase) per outermost collective call.
    calls: list[tuple[str, int, str]] = field(default_factory=list)
    # Nesting depth per thread, so a collective implemented by another is counted once.
    _depth: threading.local = field(default_factory=threading.local, repr=False)

    def _wrap(self, name: str, fn: Callable) -> Callable:
        kind, arg_index, keyword = COLLECTIVES[name]

        def counted(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                volume = args[arg_index] if len(args) > arg_index else kwargs.get(keyword)
                self.calls.append((kind, tensor_bytes(volume), self.phase))
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        return counted

    @contextlib.contextmanager
    def patched(self):
        originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        try:
            for name, fn in originals.items():
                setattr(dist, name, self._wrap(name, fn))
            yield self
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)

    def summary(self) -> dict[str, dict[str, int]]:
        """{"<kind>@<phase>": {"calls": n, "bytes": b}}."""
        out: dict[str, dict[str, int]] = {}
        for kind, nbytes, phase in self.calls:
            entry = out.setdefault(f"{kind}@{phase}", {"calls": 0, "bytes": 0})
            entry["calls"] += 1
            entry["bytes"] += nbytes
        return out


@dataclass
class Timeline:
    """Gathered bytes per layer at each boundary-gradient event of backward."""

    # Reads the gathered bytes of every layer now.
    probe: Callable[[], list[int]]
    # (event, boundary index, gathered bytes per layer); boundary k is the input of layer k (n = model output).
    events: list[tuple[str, int, list[int]]] = field(default_factory=list)

    def mark(self, event: str, boundary: int) -> None:
        self.events.append((event, boundary, list(self.probe())))

    def watch_boundaries(self, boundaries: dict[int, torch.Tensor]) -> None:
        """Hook every boundary tensor that requires grad. Call after forward, so these hooks run after the
        wrapper's own (registered during forward): at the event, the wrapper has done what it does there."""
        for k, tensor in sorted(boundaries.items()):
            if tensor.requires_grad:
                tensor.register_hook(lambda grad, k=k: self.mark("grad_done", k))


def capture_boundaries(layers: list[torch.nn.Module], x: torch.Tensor) -> tuple[dict[int, torch.Tensor], list]:
    """Forward hooks that keep each layer's output (boundary k+1); boundary 0 is the input itself."""
    boundaries: dict[int, torch.Tensor] = {0: x}
    handles = []
    for i, layer in enumerate(layers):
        def keep(module, args, output, i=i):
            boundaries[i + 1] = output

        handles.append(layer.register_forward_hook(keep))
    return boundaries, handles
