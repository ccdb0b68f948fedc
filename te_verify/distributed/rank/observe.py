"""Observers used inside a rank: a collective counter and an unshard/reshard timeline.

The counter patches torch.distributed's collective functions for the duration of a case (the wrappers look
them up on the module at call time, DDP its buffer broadcast `_broadcast_coalesced` too) and records each outermost
call's kind, bytes, phase and what its payload carries (distributed.carried, run with the probes' dispatch mode
off, so the probes never see its work). The timeline snapshots how many bytes of gathered parameter storage every
layer holds each time a layer boundary's gradient is done -- a measurement of storage, not a count of hook calls.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from te_verify.checks.collectives import Carried, Collective
from te_verify.distributed.rank.carried import collective_tensors

# An argument: its position and keyword.
Arg = tuple[int, str]
# Function name -> (kind, the argument holding the full-volume tensor(s), the argument holding what this rank
# contributes: the input of a gather or reduction, the tensor(s) a broadcast sends).
COLLECTIVES: dict[str, tuple[str, Arg, Arg]] = {
    "all_reduce": ("all_reduce", (0, "tensor"), (0, "tensor")),
    "reduce_scatter": ("reduce_scatter", (1, "input_list"), (1, "input_list")),
    "reduce_scatter_tensor": ("reduce_scatter", (1, "input"), (1, "input")),
    "reduce_scatter_single": ("reduce_scatter", (1, "input"), (1, "input")),
    "_reduce_scatter_base": ("reduce_scatter", (1, "input"), (1, "input")),
    "all_gather": ("all_gather", (0, "tensor_list"), (1, "tensor")),
    "all_gather_into_tensor": ("all_gather", (0, "output_tensor"), (1, "input_tensor")),
    "all_gather_single": ("all_gather", (0, "output_tensor"), (1, "input_tensor")),
    "_all_gather_base": ("all_gather", (0, "output_tensor"), (1, "input_tensor")),
    "broadcast": ("broadcast", (0, "tensor"), (0, "tensor")),
    "_broadcast_coalesced": ("broadcast", (1, "tensors"), (1, "tensors")),
}


def argument(args: tuple, kwargs: dict, arg: Arg):
    index, keyword = arg
    return args[index] if len(args) > index else kwargs.get(keyword)


def tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(t) for t in obj)
    return 0


def payload_dtype(tensors: list[torch.Tensor]) -> str:
    """The dtype(s) of the tensors a collective was called with, below any wrapper ("bfloat16"; "a+b" if mixed)."""
    return "+".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))


@dataclass
class CollectiveCounter:
    """Records collectives by kind, bytes, phase and what they carry while active."""

    # Current phase label ("forward" / "backward" / "step"), set by the case runner; "backward" reads as
    # "backward_end" where no autograd node runs (an end-of-backward callback).
    phase: str = "setup"
    # Names what a payload carries (distributed.carried.Attribution); None records nothing carried.
    attribute: Callable[[list[torch.Tensor]], tuple[Carried, ...]] | None = None
    # The training iteration and its microbatch running (a training engine's case sets them).
    iteration: int = 0
    microbatch: int = 0
    # One record per outermost collective call.
    calls: list[Collective] = field(default_factory=list)
    # Nesting depth per thread, so a collective implemented by another is counted once.
    _depth: threading.local = field(default_factory=threading.local, repr=False)

    def current_phase(self) -> str:
        if self.phase == "backward" and torch._C._current_autograd_node() is None:
            return "backward_end"
        return self.phase

    def _record(self, kind: str, volume, payload) -> None:
        carries, tensors = (), collective_tensors(payload)
        if self.attribute is not None:
            with _disable_current_modes():  # the probes' dispatch mode: this work is not the run's
                carries = self.attribute(tensors)
        self.calls.append(Collective(kind, tensor_bytes(volume), self.current_phase(), carries, self.iteration,
                                     self.microbatch, payload_dtype(tensors)))

    def _wrap(self, name: str, fn: Callable) -> Callable:
        kind, volume_arg, payload_arg = COLLECTIVES[name]

        def counted(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self._record(kind, argument(args, kwargs, volume_arg), argument(args, kwargs, payload_arg))
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        return counted

    @contextlib.contextmanager
    def patched(self):
        originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        places = [(dist, name, name) for name in originals] + captured_aliases(originals)
        try:
            for module, attr, name in places:
                setattr(module, attr, self._wrap(name, originals[name]))
            yield self
        finally:
            for module, attr, name in places:
                setattr(module, attr, originals[name])


_ALIASES: dict[int, list[tuple]] = {}  # len(sys.modules) -> the aliases found then (rescanned when modules load)


def captured_aliases(originals: dict[str, Callable]) -> list[tuple[object, str, str]]:
    """(module, attribute, collective) for every module-level alias of a torch.distributed collective outside torch
    (megatron-core binds `dist_reduce_scatter_func = torch.distributed.reduce_scatter_tensor` at import): a library
    that calls its alias must be counted like one that looks the function up on torch.distributed."""
    key = len(sys.modules)
    if key not in _ALIASES:
        by_id = {id(fn): name for name, fn in originals.items()}
        found = []
        for module_name, module in list(sys.modules.items()):
            if module is None or module_name.split(".")[0] == "torch":
                continue
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                name = by_id.get(id(value))
                if name is not None and value is originals[name]:
                    found.append((module, attr, name))
        _ALIASES.clear()
        _ALIASES[key] = found
    return _ALIASES[key]


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
    return boundaries, keep_boundaries(layers, boundaries, with_input=False)


def keep_boundaries(layers: list[torch.nn.Module], boundaries: dict[int, torch.Tensor],
                    with_input: bool = True) -> list:
    """Hooks that put each layer's output in `boundaries` (boundary k+1) on every forward, and the first layer's
    input (boundary 0) where `with_input`: an engine's microbatches are inputs the case does not hold.

    Both run before the wrapper's own hooks on the layer (prepend): a wrapper whose hooks replace a layer's output or
    input with an autograd Function of its own (ZeRO-3's pre- and post-backward functions, Megatron-FSDP's views)
    runs that Function's backward -- gathering layer k, releasing layer k+1 -- before the gradient reaches the
    tensor kept here, so at "grad_done" the wrapper has done what it does at that boundary, as FSDP's tensor hooks
    have (the boundary's hooks are registered after forward, after the wrapper's)."""
    handles = []
    if with_input and layers:
        handles.append(layers[0].register_forward_pre_hook(lambda module, args: boundaries.__setitem__(0, args[0]),
                                                           prepend=True))
    for i, layer in enumerate(layers):
        def keep(module, args, output, i=i):
            boundaries[i + 1] = output

        handles.append(layer.register_forward_hook(keep, prepend=True))
    return handles
