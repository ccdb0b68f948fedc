"""The layers of a probed run as its forward GEMMs show them: each layer's weight storage, its input views and their
data, what fed it. Built by the dispatch watcher (probes.watcher) and read by the probes that attribute GEMMs and
saved tensors to layers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from te_verify.probes import extents

StorageKey = Any  # int serial for storages made during the run, ("pre", data_ptr) for older ones


@dataclass
class LayerMap:
    """The layers as seen through forward GEMMs, in forward order."""

    # Storage key of each layer's weight, by layer index.
    weight_keys: list[StorageKey] = field(default_factory=list)
    # Weight shape (out, in) of each layer.
    weight_shapes: list[tuple[int, ...]] = field(default_factory=list)
    # Every layer whose forward input (the non-weight operand of its forward GEMMs) is that view (storage key,
    # offset, numel: compilers pack several activations into one storage; a model family's q, k and v share one).
    input_sets: dict[tuple, frozenset] = field(default_factory=dict, repr=False)
    # Every layer whose forward input lives in that storage.
    input_key_sets: dict[StorageKey, frozenset] = field(default_factory=dict, repr=False)
    # The view each layer's forward GEMM wrote (its output): a layer whose input is another's output is fed by it.
    output_views: dict[tuple, int] = field(default_factory=dict, repr=False)
    # A fingerprint of each input view's data (fingerprint()): a compiler may later reuse the buffer in place.
    input_prints: dict[tuple, float] = field(default_factory=dict, repr=False)
    # Storage key -> (extent, view) of each input view (probes.extents): the view itself, or the source of the copy
    # a forward GEMM read. A slice of it, or a copy of a slice (a split-K GEMM's), is found by overlapping bytes.
    input_regions: dict[StorageKey, list[tuple[extents.Extent, tuple]]] = field(default_factory=dict, repr=False)
    # 2-D shape of each layer's input as its forward GEMM saw it (None until then).
    input_shapes: list[tuple[int, ...] | None] = field(default_factory=list)
    # Index for the per-GEMM lookups: weight key -> layer.
    _weight_layer: dict[StorageKey, int] = field(default_factory=dict, repr=False)
    # The exact view (storage key, offset, numel) of each bound weight: weights flattened into one buffer share a
    # storage key, not a view.
    weight_views: dict[tuple, int] = field(default_factory=dict, repr=False)
    # id() of each layer's weight Parameter object(s): a wrapper may swap a Parameter's storage (FSDP gathers it
    # anew for backward) but keeps the object.
    _param_layer: dict[int, int] = field(default_factory=dict, repr=False)

    def set_input_shape(self, layer: int, shape: tuple[int, ...]) -> None:
        if self.input_shapes[layer] is None:
            self.input_shapes[layer] = shape

    def add_layer(self, weight_key: StorageKey, weight_shape: tuple[int, ...],
                  input_shape: tuple[int, ...] | None) -> int:
        # A weight shared by several layers (tied) is the first's: the oracle judges tied sites under the first label.
        self._weight_layer.setdefault(weight_key, len(self.weight_keys))
        self.weight_keys.append(weight_key)
        self.weight_shapes.append(weight_shape)
        self.input_shapes.append(input_shape)
        return len(self.weight_keys) - 1

    def add_input(self, layer: int, key: StorageKey, view: tuple | None = None, print_: float | None = None) -> None:
        self.input_key_sets[key] = self.input_key_sets.get(key, frozenset()) | {layer}
        if view is not None:
            if print_ is not None and self.input_prints.get(view, print_) != print_:  # the buffer holds a new value:
                self.input_sets.pop(view, None)  # the layers that read its old value no longer own it
            self.input_sets[view] = self.input_sets.get(view, frozenset()) | {layer}
            if print_ is not None:
                self.input_prints[view] = print_

    def add_region(self, extent: extents.Extent, view: tuple) -> None:
        regions = self.input_regions.setdefault(extent.key, [])
        if not any(v == view for _, v in regions):
            regions.append((extent, view))

    def layers_of_input_view(self, view: tuple, print_: float | None = None) -> frozenset:
        """Every layer whose forward input is this view (empty if the buffer now holds other data)."""
        if print_ is not None and self.input_prints.get(view, print_) != print_:
            return frozenset()
        return self.input_sets.get(view, frozenset())

    def feeders(self, layer: int) -> frozenset:
        """Layers whose forward output is `layer`'s input as is (LoRA's A feeds B)."""
        return frozenset(self.output_views[v] for v, layers in self.input_sets.items()
                         if layer in layers and v in self.output_views)

    def layer_of_weight(self, key: StorageKey) -> int | None:
        return self._weight_layer.get(key)

    def layer_of_weight_view(self, view: tuple) -> int | None:
        return self.weight_views.get(view)

    def layer_of_param(self, param: torch.nn.Parameter) -> int | None:
        return self._param_layer.get(id(param))

    def alias_weight(self, layer: int, key: StorageKey, param: torch.nn.Parameter) -> None:
        """Another storage and Parameter object that are `layer`'s weight (a wrapper's unsharded copy)."""
        self._weight_layer.setdefault(key, layer)
        self._param_layer.setdefault(id(param), layer)

    def weights_only(self) -> "LayerMap":
        """The same layers (weights, their aliases) with nothing learnt of their inputs: a later iteration's forward
        reads new activations, and a sharded wrapper's copies are adopted again (`Watcher._adopt`)."""
        return LayerMap(list(self.weight_keys), list(self.weight_shapes), input_shapes=[None] * len(self.weight_keys),
                        weight_views=dict(self.weight_views), _weight_layer=dict(self._weight_layer),
                        _param_layer=dict(self._param_layer))

    def unique_layer(self, shapes: list[tuple[int, ...]], shape: tuple[int, ...], transposed_too: bool) -> int | None:
        """The one layer whose listed shape matches `shape` (or its transpose), else None."""
        wanted = {tuple(shape), tuple(reversed(shape))} if transposed_too else {tuple(shape)}
        hits = [i for i, s in enumerate(shapes) if s in wanted]
        return hits[0] if len(hits) == 1 else None


def only(layers: frozenset) -> int | None:
    """The single member of `layers`, else None."""
    return next(iter(layers)) if len(layers) == 1 else None
