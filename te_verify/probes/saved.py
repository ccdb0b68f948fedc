"""Saved-for-backward bytes and count, through torch.autograd.graph.saved_tensors_hooks.

Counts new allocations only: a saved tensor counts when its storage was first produced by an op during the
run (the shared Watcher's storage keys), so parameters, the model input and views of either never count,
whatever view or dtype wrapper a backend saves them through; nor does a Parameter whose storage a sharded wrapper
gathered during the run (the gathered bytes are the reshard checks' measure). Saved tensors are deduplicated by storage and
sized by their storage's bytes (what saving keeps alive).

A saved wrapper subclass (TE's Float8Tensor, DTensor) counts as the inner tensors it holds (`wrapped_tensors`). The hooks see what eager autograd saves and what custom autograd.Functions save with
ctx.save_for_backward:
thunder's ThunderFunction and torch.compile's CompiledFunction both do (checked on torch 2.13 / thunder
0.2.6), so their saves are visible. A backend whose saves bypass the hooks (e.g. a C++ extension keeping its
own context) shows none; the waste check then reports the saved figures as "unknown", not as zero.

Of what the forward packs before the first backward pass starts, only the storages still alive then count: a tensor
packed for a graph that is dropped before backward is not kept for it (a non-reentrant checkpoint packs its block's
inputs even where no gradient flows through the block, and frees them with the block's unused graph); a later
microbatch's forward counts as packed. What autograd saves while its engine runs a backward (a reentrant
checkpoint's recompute builds and saves a graph of its block there; torch._C._current_graph_task_id() tells, whatever
phase a runner names) is backward's working memory, which the peak judges: not counted, its count a figure.

Per layer: a saved storage that is a layer's forward input (same storage as the operand of its forward GEMM)
is that layer's "input"; where the watcher follows copies, a copy (an FP8 cast) of a weight is that layer's
"weight_copy" and one of a layer's input its "input_copy"; otherwise a new tensor of a weight's shape (or
transpose) is a "weight_copy" of the layer with that shape (None if several layers share it); everything else is
"other".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from te_verify.probes import dispatch
from te_verify.probes.layer_map import LayerMap
from te_verify.probes.storage_keys import is_real, param_of
from te_verify.probes.watcher import Watcher, fingerprint


@dataclass(frozen=True)
class SavedItem:
    """One tensor handed to autograd's pack hook."""

    # Storage key from the Watcher (int serial for new storages, ("pre", ptr) for older ones); other probes of the
    # run (the tex record) key storages the same way, so records join on it.
    key: Any
    # True when the storage was allocated during the run (what the figures count).
    new: bool
    # Bytes of the whole storage (what keeping the tensor alive costs).
    storage_bytes: int
    # numel * element_size of the tensor as saved (the notes' raw measure).
    tensor_bytes: int
    # Shape and dtype as saved.
    shape: tuple[int, ...]
    dtype: str
    # The view (storage key, offset, numel) it was copied from when the watcher follows copies (an FP8 copy of a
    # weight or an activation), else its own view.
    root: tuple = ()
    # Its own view (storage key, offset, numel) and a fingerprint of its data when saved (new storages only): a
    # compiler may reuse a layer input's buffer for another value, which is then not that input.
    view: tuple = ()
    print_: float | None = None
    # Packed before the first backward pass started (a later microbatch's forward packs after it).
    before_backward: bool = True


@dataclass(frozen=True)
class SavedAttribution:
    """A deduplicated new saved storage with what it is for."""

    # "input", "weight_copy", "input_copy" (a copy of a layer's input, when copies are followed) or "other".
    kind: str
    # Layer index, or None when it cannot be told.
    layer: int | None
    # Storage bytes.
    nbytes: int
    # Shape of (the first tensor saved from) the storage.
    shape: tuple[int, ...]
    # Every layer it is the forward input of, when several share it (a model family's q, k and v).
    shared_by: frozenset = frozenset()
    # dtype of (the first tensor saved from) the storage: a weight copy's names the cast (bf16 under autocast).
    dtype: str = ""


def _holds_other_data(item: SavedItem, layers: LayerMap) -> bool:
    """The saved view is a layer input's view, but its data is not that input's any more (a reused buffer)."""
    recorded = layers.input_prints.get(item.view)
    return recorded is not None and item.print_ is not None and recorded != item.print_


def _as(item: SavedItem, kind: str, readers: frozenset) -> SavedAttribution:
    """An input (or a copy of one) of the layer(s) reading it: one layer by index, several as `shared_by`."""
    if len(readers) == 1:
        return SavedAttribution(kind, next(iter(readers)), item.storage_bytes, item.shape)
    return SavedAttribution(kind, None, item.storage_bytes, item.shape, readers)


def attribute_saved(item: SavedItem, layers: LayerMap) -> SavedAttribution:
    if _holds_other_data(item, layers):
        return SavedAttribution("other", None, item.storage_bytes, item.shape)
    # By view first (a reused buffer's storage key still names its old readers), then by storage.
    readers = layers.input_sets.get(item.view) or layers.input_key_sets.get(item.key, frozenset())
    if readers:
        return _as(item, "input", readers)
    if item.root and item.root[0] != item.key:  # a copy: its source names it
        layer = layers.layer_of_weight(item.root[0])
        if layer is not None:
            return SavedAttribution("weight_copy", layer, item.storage_bytes, item.shape)
        readers = layers.layers_of_input_view(item.root) or layers.input_key_sets.get(item.root[0], frozenset())
        if readers:
            return _as(item, "input_copy", readers)
    wanted = {item.shape, tuple(reversed(item.shape))}
    if any(s in wanted for s in layers.weight_shapes):
        layer = layers.unique_layer(layers.weight_shapes, item.shape, transposed_too=True)
        return SavedAttribution("weight_copy", layer, item.storage_bytes, item.shape)
    return SavedAttribution("other", None, item.storage_bytes, item.shape)


def wrapped_tensors(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors a wrapper subclass holds (TE's Float8Tensor, DTensor, ...), or None for a tensor with storage of
    its own: torch's __tensor_flatten__ protocol where implemented (TE >= 2.20), else its tensor attributes."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return None
    if hasattr(t, "__tensor_flatten__"):
        return [getattr(t, attr) for attr in t.__tensor_flatten__()[0]]
    try:
        t.untyped_storage().data_ptr()
        return None
    except RuntimeError:  # a wrapper made with _make_wrapper_subclass has no storage of its own
        return [v for v in vars(t).values() if isinstance(v, torch.Tensor)]


class SavedTensorsProbe:
    """Records every tensor autograd saves during the run."""

    name = "saved"

    def __init__(self) -> None:
        # SavedItem fields as tuples while the run goes (cheap to make in the hook), SavedItems once asked for.
        self._raw: list[tuple] = []
        self._backward_saves = 0  # tensors saved while backward ran (a recompute's): not saved for backward
        self._alive: set[int] | None = None  # serials of the storages alive when the first backward pass started
        self._watcher: Watcher | None = None
        self._hooks = None

    def again(self) -> "SavedTensorsProbe":
        """A fresh probe for a later iteration."""
        return SavedTensorsProbe()

    @property
    def items(self) -> list[SavedItem]:
        return [SavedItem(key, new, storage_bytes, tensor_bytes, shape, str(dtype), root, view, print_, before)
                for key, new, storage_bytes, tensor_bytes, shape, dtype, root, view, print_, before in self._raw]

    def __enter__(self) -> "SavedTensorsProbe":
        self._raw, self._backward_saves, self._alive = [], 0, None
        self._watcher = dispatch.subscribe(self)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(None, None, None)
        dispatch.unsubscribe(self)

    def phase(self, name: str, index: int = 0) -> None:
        if name == "backward" and self._alive is None:
            self._alive = self._watcher.live_serials()
        dispatch.set_phase(name)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() != -1:  # autograd's engine is running a backward (a recompute's graph)
            self._backward_saves += 1
            return t
        inner = wrapped_tensors(t)
        if inner is not None:  # a wrapper subclass: what saving keeps alive is the tensors it holds
            for tensor in inner:
                self._pack(tensor)
            return t
        if is_real(t):
            storage = t.untyped_storage()
            key = self._watcher.key(t)
            root = self._watcher.root_view(t) if self._watcher.follow_copies else ()
            new = type(key) is int and param_of(t) is None  # a Parameter is model state wherever it lives
            view, print_ = (self._watcher.view_key(t), fingerprint(t)) if new else ((), None)
            self._raw.append((key, new, storage.nbytes(), t.numel() * t.element_size(), tuple(t.shape), t.dtype, root,
                              view, print_, self._alive is None))
        return t

    def new_storages(self, items: list[SavedItem] | None = None) -> list[SavedAttribution]:
        """Deduplicated new saved storages, attributed to layers."""
        first_by_key: dict[Any, SavedItem] = {}
        for item in self.items if items is None else items:
            if item.new and (self._alive is None or not item.before_backward or item.key in self._alive):
                first_by_key.setdefault(item.key, item)
        return [dataclasses.replace(attribute_saved(item, self._watcher.layers), dtype=item.dtype)
                for item in first_by_key.values()]

    def figures(self) -> dict[str, Any]:
        items = self.items
        kept = self.new_storages(items)
        by_layer: dict[str, int] = {}
        for a in kept:
            label = f"{a.kind}@{a.layer}" if a.layer is not None else f"{a.kind}@?"
            by_layer[label] = by_layer.get(label, 0) + a.nbytes
        return {
            "saved_bytes_actual": sum(a.nbytes for a in kept),
            "saved_count_actual": len(kept),
            "saved_bytes_raw": sum(i.tensor_bytes for i in items),
            "saved_count_raw": len(items),
            "saved_count_in_backward": self._backward_saves,
            "saved_by_layer": by_layer,
        }

    def observations(self) -> dict[str, Any]:
        items = self.items
        # Whether copies were followed: then a storage attributed to no weight or input copy is measured as no copy,
        # and an empty list of copies is a measurement (an all-frozen FP8 case keeps none), not a missing record.
        return {"saved_items": items, "saved_storages": self.new_storages(items),
                "copies_followed": self._watcher.follow_copies}


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
