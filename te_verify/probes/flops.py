"""GEMMs and FLOPs by phase (forward/backward pass k), role (fprop/dgrad/wgrad) and layer.

Counts every GEMM-family aten op (gemm_ops.GEMM_OPERANDS: mm, addmm, bmm, baddbmm, addbmm, mv, addmv,
_addmm_activation, _scaled_mm, in-place and out= variants included), and the convolutions that are GEMMs
(probes.conv_gemms: LitGPT's fused-qkv LoRA B), as they run on real tensors (the shared Watcher in dispatch.py;
FLOPs with the formula of torch.utils.flop_counter: 2*m*k*n per GEMM, bias adds not counted), so it sees eager,
thunder's torch executor and torch.compile's aot_eager graphs alike, and never a compiler's FakeTensor or
proxy tracing. GEMMs that do not run as aten ops (fused kernels, TE's cuBLAS calls) are not seen.

How roles and layers are attributed (see dispatch.py for how layers are learnt: `bind` hands it the model's
linear weights, so views of their storage attribute whatever the backend calls them):
- forward phase: every GEMM is "fprop"; its layer is the one whose weight (by storage) is an operand.
- backward: an operand that is a layer's weight (same storage, any view; with copies followed, any view of a copy
  of it) => that layer's "dgrad" where the GEMM contracts over the weight's out-features, its "fprop" where over its
  in-features (a recompute of a checkpointed layer's forward runs in backward: a role is what the GEMM computes, not
  when), read from the operand's strides against where the weight's axes lie in its storage (probes.weight_axes:
  the Parameter's, or a copy's as worked out when it was made); else a
  "wgrad", of the layer whose forward input (same view: storage, offset and size) is an operand and whose dgrad
  consumed the same output gradient; where these two data-flow signals disagree (a compiler reused a buffer),
  the layer is None and the check judges that pass by role and FLOPs, saying so.
- otherwise by output shape: the shape (or transpose) of some weight => "wgrad", of some layer input =>
  "dgrad"; the layer is named only if exactly one layer has that shape. In square stacks the layer is then
  None, and the role is "unknown" when the output shape matches both a weight and an input (batch == width).
  A backend that computes with copies of weights or activations (FP8 casts) is attributed this way.
A GEMM over a slice of a layer's operands (a view of the weight's storage, a K-slice of the input) is that
layer's work: the checks add FLOPs per layer and role, so split-K is not counted as extra GEMMs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from te_verify.oracle.sites import linear_weights
from te_verify.probes import dispatch
from te_verify.probes.layer_map import LayerMap, only
from te_verify.probes.watcher import Watcher, fingerprint
from te_verify.probes.weight_axes import contracts_in


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


@dataclass(frozen=True)
class RawGemm:
    """What the probe notes while a GEMM runs; roles and layers are decided after the run (`attribute_all`)."""

    phase: str
    pass_index: int
    op: Any
    shape: tuple[int, ...]
    flops: int
    # Layer whose weight's storage is an operand, and layer whose forward input (as a view) is an operand.
    weight_layer: int | None
    input_layer: int | None
    # The two operands as views (storage key, offset, numel), and those of them that are a layer's weight.
    views: tuple
    weight_views: tuple = ()
    # Every layer whose forward input (as a view) is an operand: several where sites share an input.
    input_layers: frozenset = frozenset()
    # The GEMM's output as a view (a dgrad's output is the gradient of the layers feeding that layer).
    out_view: tuple = ()
    # Whether the weight operand is contracted over its in-features (a forward GEMM's, run again by a recompute);
    # False over its out-features (a dgrad); None with no weight operand.
    contracts_in: bool | None = None


def note_gemm(watcher: Watcher, phase: str, pass_index: int, func: Any, operands: tuple, out: torch.Tensor,
              flops: int) -> RawGemm:
    weight_layer, contracted_in = None, None
    input_layers, weight_views, shared = set(), [], frozenset()
    operands = [t for t in operands if isinstance(t, torch.Tensor)]
    for position, t in enumerate(operands):
        root = watcher.root_view(t)
        layer = watcher.weight_layer_of(t)
        if layer is not None:
            weight_views.append(root)
            if weight_layer is None:
                contracted_in = contracts_in(t, position, watcher.layers.weight_shapes[layer], watcher.axes_of(t))
        weight_layer = weight_layer if weight_layer is not None else layer
        # A copy's data differs from its source's by design; an operand itself must still hold the input's data.
        as_is = root == watcher.view_key(t)
        data = fingerprint(t) if phase != "forward" and as_is else None
        readers = watcher.layers.layers_of_input_view(root, data)
        if not readers and phase != "forward":  # a slice of an input, or a cast of one (split-K's wgrad over rows)
            readers = watcher.input_layers_overlapping(t)
        input_layers.add(only(readers))
        shared |= readers
    input_layers.discard(None)
    input_layer = input_layers.pop() if len(input_layers) == 1 else None  # two layers' inputs: cannot tell
    shape = tuple(out.shape)
    return RawGemm(phase, pass_index, func, shape, flops, weight_layer, input_layer,
                   tuple(watcher.root_view(t) for t in operands), tuple(weight_views), shared, watcher.view_key(out),
                   contracted_in)


def _by_shape(layers: LayerMap, shape: tuple[int, ...], rows: frozenset = frozenset()) -> tuple[str, int | None]:
    """Role (and layer, if one layer has the shape) from a backward GEMM's output shape. `rows`: the forward
    GEMMs' row counts, so an input gradient is known by (rows, fan-in) even where no layer's input was seen."""
    wanted = {shape, tuple(reversed(shape))}
    weight_like = any(s in wanted for s in layers.weight_shapes)
    fan_ins = {s[-1] for s in layers.weight_shapes}
    input_like = shape in layers.input_shapes or (len(shape) == 2 and shape[0] in rows and shape[1] in fan_ins)
    if weight_like and not input_like:
        return "wgrad", layers.unique_layer(layers.weight_shapes, shape, transposed_too=True)
    if input_like and not weight_like:
        return "dgrad", layers.unique_layer(layers.input_shapes, shape, transposed_too=False)
    return "unknown", None


def _wgrad_layer(raw: RawGemm, grad_layers: dict, layers: LayerMap) -> int | None:
    """The one layer every known signal allows: layers whose forward input is an operand; layers whose output
    gradient is an operand (the one their dgrad consumed, or one a dgrad produced for the layer they feed); layers
    whose weight has the output's shape where sites share an input. None when the signals disagree (compilers
    reuse buffers) or leave several."""
    by_grad = set().union(*(grad_layers[v] for v in raw.views if v in grad_layers))
    by_input = {raw.input_layer} if raw.input_layer is not None else set(raw.input_layers)
    signals = [s for s in (by_input, by_grad) if s]
    if len(by_input) > 1:
        signals.append({i for i in by_input if layers.weight_shapes[i] in (raw.shape, tuple(reversed(raw.shape)))})
    candidates = set.intersection(*signals) if signals else set()
    return candidates.pop() if len(candidates) == 1 else None


def attribute_all(raws: list[RawGemm], layers: LayerMap) -> list[GemmEvent]:
    """(role, layer) of every GEMM, by the rules in the module docstring."""
    consumed: dict = {}  # an output gradient a known dgrad consumed (view) -> its layers (LoRA's base and B share one)
    produced: dict = {}  # a known dgrad's result (view) -> the layers feeding that dgrad's layer (whose gradient it is)
    for r in raws:
        if r.phase != "forward" and r.weight_layer is not None and not r.contracts_in:
            for view in r.views:
                if view not in r.weight_views:
                    consumed.setdefault(view, set()).add(r.weight_layer)
            feeders = layers.feeders(r.weight_layer)
            if feeders:
                produced.setdefault(r.out_view, set()).update(feeders)
    grad_layers = {v: consumed.get(v, set()) | produced.get(v, set()) for v in set(consumed) | set(produced)}
    rows = frozenset(r.shape[0] for r in raws if r.phase == "forward" and len(r.shape) == 2)
    events = []
    for r in raws:
        if r.phase == "forward":
            role, layer = "fprop", r.weight_layer
        elif r.weight_layer is not None:
            role, layer = "fprop" if r.contracts_in else "dgrad", r.weight_layer
        elif r.input_layers or any(v in consumed for v in r.views):  # a dgrad on an unknown weight copy is neither
            role, layer = "wgrad", _wgrad_layer(r, grad_layers, layers)
        else:
            role, layer = _by_shape(layers, r.shape, rows)
        events.append(GemmEvent(r.phase, r.pass_index, role, layer, str(r.op), r.shape, r.flops))
    return events


class GemmProbe:
    """Records every GEMM with its FLOPs, phase, role and layer."""

    name = "gemms"

    def __init__(self, follow_copies: bool = False) -> None:
        # follow_copies: attribute GEMMs on copies of weights and activations (watcher.Watcher.follow_copies).
        self.follow_copies = follow_copies
        # What each GEMM looked like while it ran; roles and layers are decided once the run is over.
        self._raw: list[RawGemm] = []
        self._events: list[GemmEvent] | None = None  # built from _raw on first ask after the run
        self._phase, self._pass = "forward", 0
        self._watcher: Watcher | None = None
        self._weights: list[torch.Tensor] = []
        self._shapes: list[tuple[int, int]] | None = None

    def bind(self, model: torch.nn.Module, shapes: list[tuple[int, int]] | None = None) -> None:
        """The model's linear-site weights (oracle.sites.linear_weights: Linears' and marked matrix Parameters), in
        layer order (what the oracle's layer indices mean); `shapes`: their
        (out, in) shapes where a sharded wrapper left the Parameters holding flat shards."""
        self._weights = [site.weight for site in linear_weights(model)]
        self._shapes = shapes

    def again(self) -> "GemmProbe":
        """A fresh probe like this one for a later iteration (the runner binds it)."""
        return GemmProbe(self.follow_copies)

    @property
    def events(self) -> list[GemmEvent]:
        if self._events is None or len(self._events) != len(self._raw):
            self._events = attribute_all(self._raw, self._watcher.layers)
        return self._events

    def __enter__(self) -> "GemmProbe":
        self._raw, self._events = [], None
        self._watcher = dispatch.subscribe(self)
        self._watcher.follow_copies |= self.follow_copies
        self._watcher.bind_weights(self._weights, self._shapes)
        self._watcher.gemm_listeners.append(self._on_gemm)
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.gemm_listeners.remove(self._on_gemm)
        dispatch.unsubscribe(self)

    def phase(self, name: str, index: int = 0) -> None:
        self._phase, self._pass = name, index
        dispatch.set_phase(name)

    def _on_gemm(self, func: Any, operands: tuple, out: torch.Tensor, flops: int) -> None:
        self._raw.append(note_gemm(self._watcher, self._phase, self._pass, func, operands, out, flops))

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
