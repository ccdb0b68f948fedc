"""GEMMs and FLOPs by phase (forward/backward pass k), role (fprop/dgrad/wgrad) and layer.

Counts aten mm/addmm/bmm/baddbmm as they run on real tensors (the shared Watcher in dispatch.py; FLOPs with
the formula of torch.utils.flop_counter: 2*m*k*n per GEMM, bias adds not counted), so it sees eager,
thunder's torch executor and torch.compile's aot_eager graphs alike, and never a compiler's FakeTensor or
proxy tracing. GEMMs that do not run as aten ops (fused kernels, TE's cuBLAS calls) are not seen.

How roles and layers are attributed (see dispatch.py for how layers are learnt from forward GEMMs):
- forward phase: every GEMM is "fprop"; its layer is the one whose weight (by storage) is an operand.
- backward: an operand that is a layer's weight (same storage, any view) => "dgrad" of that layer; else an
  operand that is a layer's forward input (same storage) => "wgrad" of that layer.
- otherwise by output shape: the shape (or transpose) of some weight => "wgrad", of some layer input =>
  "dgrad"; the layer is named only if exactly one layer has that shape. In square stacks the layer is then
  None, and the role is "unknown" when the output shape matches both a weight and an input (batch == width).
  A backend that computes with copies of weights or activations (FP8 casts) is attributed this way.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from te_verify.probes import dispatch
from te_verify.probes.dispatch import LayerMap, Watcher


@dataclass(frozen=True)
class GemmEvent:
    """One GEMM that ran on real tensors."""

    # "forward" or "backward".
    phase: str
    # 0 for the forward, k for the k-th backward pass.
    pass_index: int
    # "fprop", "dgrad", "wgrad" or "unknown".
    role: str
    # Layer index, or None when it cannot be told.
    layer: int | None
    # aten op name, e.g. "aten.mm.default".
    op: str
    # Output shape.
    shape: tuple[int, ...]
    # 2*m*k*n (times the batch count for bmm).
    flops: int


def _operand_layers(watcher: Watcher, args: tuple) -> tuple[int | None, int | None]:
    """(layer whose weight is an operand, layer whose forward input is an operand)."""
    by_weight = by_input = None
    for t in args[-2:]:  # the two GEMM operands: every GEMM op's last two positional arguments
        if not isinstance(t, torch.Tensor):
            continue
        key = watcher.key(t)
        if by_weight is None:
            by_weight = watcher.layers.layer_of_weight(key)
        if by_input is None:
            by_input = watcher.layers.layer_of_input(key)
    return by_weight, by_input


def _by_shape(layers: LayerMap, shape: tuple[int, ...]) -> tuple[str, int | None]:
    wanted = {shape, tuple(reversed(shape))}
    weight_like = any(s in wanted for s in layers.weight_shapes)
    input_like = shape in layers.input_shapes
    if weight_like and not input_like:
        return "wgrad", layers.unique_layer(layers.weight_shapes, shape, transposed_too=True)
    if input_like and not weight_like:
        return "dgrad", layers.unique_layer(layers.input_shapes, shape, transposed_too=False)
    return "unknown", None


def attribute(watcher: Watcher, phase: str, args: tuple, out: torch.Tensor) -> tuple[str, int | None]:
    """(role, layer) of one GEMM, by the rules in the module docstring."""
    by_weight, by_input = _operand_layers(watcher, args)
    if phase == "forward":
        return "fprop", by_weight
    if by_weight is not None:
        return "dgrad", by_weight
    if by_input is not None:
        return "wgrad", by_input
    return _by_shape(watcher.layers, tuple(out.shape))


class GemmProbe:
    """Records every GEMM with its FLOPs, phase, role and layer."""

    name = "gemms"

    def __init__(self) -> None:
        # (phase, pass, role, layer, op, shape, flops) per GEMM: tuples while the run goes (cheap to make),
        # GemmEvents once asked for (see `events`).
        self._raw: list[tuple] = []
        self._events: list[GemmEvent] | None = None  # built from _raw on first ask after the run
        self._phase, self._pass = "forward", 0
        self._watcher: Watcher | None = None

    @property
    def events(self) -> list[GemmEvent]:
        if self._events is None or len(self._events) != len(self._raw):
            self._events = [GemmEvent(ph, k, role, layer, str(op), shape, flops)
                            for ph, k, role, layer, op, shape, flops in self._raw]
        return self._events

    def __enter__(self) -> "GemmProbe":
        self._raw, self._events = [], None
        self._watcher = dispatch.subscribe(self)
        self._watcher.gemm_listeners.append(self._on_gemm)
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.gemm_listeners.remove(self._on_gemm)
        dispatch.unsubscribe(self)

    def phase(self, name: str, index: int = 0) -> None:
        self._phase, self._pass = name, index
        dispatch.set_phase(name)

    def _on_gemm(self, func: Any, args: tuple, out: torch.Tensor) -> None:
        role, layer = attribute(self._watcher, self._phase, args, out)
        shape = tuple(out.shape)
        # torch.utils.flop_counter's convention, 2*m*k*n (bias ignored): k is the last dim of the first operand,
        # args[-2] (self of mm/bmm, mat1/batch1 of addmm/baddbmm; their beta/alpha are keyword-only).
        self._raw.append((self._phase, self._pass, role, layer, func, shape, 2 * args[-2].shape[-1] * math.prod(shape)))

    def figures(self) -> dict[str, Any]:
        events = self.events
        forward = sum(e.flops for e in events if e.phase == "forward")
        total = sum(e.flops for e in events)
        return {
            "flops_actual": total,
            "flops_forward": forward,
            "flops_backward": total - forward,
            "gemm_count": len(events),
            "gemms_unattributed": sum(1 for e in events if e.layer is None or e.role == "unknown"),
            "gemms_by_role": dict(Counter(e.role for e in events)),
        }

    def observations(self) -> dict[str, Any]:
        return {"gemm_events": list(self.events)}
