"""The dispatch-mode Watcher (probes.dispatch says what it sees and why): new storages and live bytes, the layers
learnt from forward GEMMs, GEMMs told to listeners; what each op is to it; and the running watcher."""
from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from te_verify.probes import extents, weight_axes
from te_verify.probes.conv_gemms import CONV_OPS, conv_gemms
from te_verify.probes.gemm_ops import GEMM_OPERANDS, gemm_flops
from te_verify.probes.layer_map import LayerMap, StorageKey
from te_verify.probes.storage_keys import StorageKeys, _data_ptr, is_real, param_of


def fingerprint(t: torch.Tensor) -> float:
    """A cheap summary of a tensor's data (its fp64 sum): equal for the same data, different once a buffer holds
    another tensor's.

    The probes' read, not the run's work: its fp64 copy and sum are kept out of the running watcher's live bytes.
    Called from inside the watcher's dispatch hook the mode is already off the stack; called from a saved-tensor
    pack hook (probes.saved) it is not, and the copy would count in the peak: 8 bytes per element plus the sum's 8,
    which on a 1-element bf16 activation is 16 B against the 2 B the run saved."""
    watcher = _ACTIVE[-1] if _ACTIVE else None
    if watcher is None or not watcher.counting:
        return float(t.detach().double().sum())
    watcher.counting = False
    try:
        return float(t.detach().double().sum())
    finally:
        watcher.counting = True


# What an op's outputs are, from its schema, cached per op (see _op_info): bit flags.
_FRESH = 1  # no return aliases an argument: every output storage is a new allocation (or an old one of ours)
_SCAN = 2  # some return may alias an argument: an output is new only if no argument shares its storage
_GEMM = 4  # one of GEMM_OPERANDS: learn layers and tell the listeners
_CONV = 8  # a convolution or its backward: the ones that are GEMMs tell the listeners (probes.conv_gemms)
# id(op) -> (flags, the op's C++ callable, a GEMM's operand positions); ids are stable because _KNOWN_OPS keeps
# every op alive.
_OP_INFO: dict[int, tuple[int, Callable[..., Any], tuple[int, int] | None]] = {}
_KNOWN_OPS: list[Any] = []
# Custom-op namespaces whose Python implementation runs under the watcher (a mode sees a custom op whole, its inner
# ops not): TE's torch.compile op (TE 2.20 module/linear.py) makes its quantized copies inside it, and the tex record
# keys them there, so their storages must get their serials where they are made, not when the op returns.
SEE_INSIDE = ("transformer_engine_compile",)
_AFTER_PYTHON = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)


def _inside(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a custom op's kernel (the dispatch keys below this mode's) with the active watcher on the mode stack."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            keys = keys | torch._C._dispatch_keys(a)
    with _ACTIVE[-1]:
        return func.redispatch(keys & _AFTER_PYTHON, *args, **kwargs)


def _op_info(func: Any) -> tuple[int, Callable[..., Any], tuple[int, int] | None]:
    """Flags of one op, what to call to run it, and a GEMM's operand positions. Views, in-place and out= ops (all
    returns aliased) get no tracking flag (a GEMM among them still gets _GEMM). The callable is the OpOverload's own
    C++ op, skipping its Python __call__ frame."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        kind = _SCAN
    else:
        aliased = [r.alias_info is not None for r in schema.returns]
        kind = 0 if all(aliased) else _SCAN if any(aliased) else _FRESH
    operands = GEMM_OPERANDS.get(getattr(func, "overloadpacket", None))
    if operands is not None:
        kind |= _GEMM
    elif getattr(func, "overloadpacket", None) in CONV_OPS:
        kind |= _CONV
    _KNOWN_OPS.append(func)
    run = partial(_inside, func) if getattr(func, "namespace", None) in SEE_INSIDE else getattr(func, "_op", func)
    _OP_INFO[id(func)] = info = (kind, run, operands)
    return info


class Watcher(TorchDispatchMode, StorageKeys):
    """Tracks new storages (live bytes, peaks) and forward GEMM layers; forwards GEMMs to subscribers.

    The dispatch hook is the per-op cost of every probed run, so its common path (an allocating op with one
    plain tensor output) is one dict lookup for the op's kind, one for the storage, and a weakref per new
    storage; views and in-place ops return after the kind lookup.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"  # set by the probes' phase() calls
        self.counting = True  # False in the "idle" phase
        self.layers = LayerMap()
        # Called with (op, its two operands, output, FLOPs) per GEMM (a convolution's backward is two).
        self.gemm_listeners: list[Callable[[Any, tuple, torch.Tensor, int], None]] = []
        # data_ptr -> (serial, nbytes, weakref whose callback untracks the storage) of live new storages
        self._live: dict[int, tuple[int, int, weakref.ref]] = {}
        self._serial = 0
        self._paused = False  # popped off the mode stack for an idle phase
        self.current_bytes = 0
        self.peak_bytes = 0
        self.window_peak_bytes = 0  # peak since the last reset_window()
        self.follow_copies = False
        # A copy's storage -> the view it was made from (root_view: any view of the copy, a slice or a broadcast
        # as matmul makes for bmm, leads there), and that view's extent (its bytes: probes.extents).
        self._derived: dict[StorageKey, tuple] = {}
        self._extents: dict[StorageKey, extents.Extent] = {}
        # Storage key -> where a layer's weight's axes lie in it (probes.weight_axes): the weights', their copies'.
        self._axes: dict[StorageKey, weight_axes.Axes] = {}
        # data_ptr -> (generation, weakref) of the last GEMM operand storage at that address that no dispatched op
        # allocated (the model input; inductor's buffers): each new storage object seen there is a new generation
        self._seen: dict[int, tuple[int, weakref.ref]] = {}
        self._weight_ptrs: set[int] = set()  # storages of the bound weights: keyed ("pre", ptr), never "seen"
        self._bound = False  # bind_weights named the layers

    def reset_window(self) -> None:
        self.window_peak_bytes = self.current_bytes

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # probes.dispatch._skip_dynamo_in_dispatch does it without a wrapper frame per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _OP_INFO.get(id(func)) or _op_info(func)
        kind = info[0]
        out = info[1](*args, **kwargs) if kwargs else info[1](*args)
        if not kind or not self.counting:  # views/in-place; or the harness's own work (snapshots)
            return out
        if kind & _FRESH and type(out) is torch.Tensor:  # the common case, inlined
            storage = out.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and self._tracked(storage, ptr) is None:
                self._add(storage, ptr)
        elif kind & (_FRESH | _SCAN):
            self._track_outputs(out, args, scan=bool(kind & _SCAN))
        if self.follow_copies and kind & _FRESH and not kind & _GEMM and isinstance(out, torch.Tensor) and is_real(out):
            self._note_copy(out, args)
        if kind & _GEMM and isinstance(out, torch.Tensor) and is_real(out):
            a, b = (args[i] for i in info[2])  # positional in dispatch: only keyword-only arguments are kwargs
            self._gemm(func, (a, b), out, gemm_flops(a, b))
        elif kind & _CONV and all(is_real(o) for o in (out if isinstance(out, tuple) else (out,)) if o is not None):
            for operands, result, flops in conv_gemms(func, args, out):
                self._gemm(func, operands, result, flops)
        return out

    def _gemm(self, func: Any, operands: tuple, out: torch.Tensor, flops: int) -> None:
        """One GEMM on real tensors: learn a layer in the forward, tell listeners."""
        if self.phase == "forward":
            self._learn_layer(operands, out)
        for listener in self.gemm_listeners:
            listener(func, operands, out, flops)

    def _track_outputs(self, out: Any, args: tuple, scan: bool) -> None:
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(o, torch.Tensor) or not is_real(o):
                continue
            storage = o.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0 or self._tracked(storage, ptr) is not None:
                continue
            # A view or in-place result of an older tensor shares its storage: not an allocation.
            if scan and any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args):
                continue
            self._add(storage, ptr)

    def _add(self, storage: torch.UntypedStorage, ptr: int) -> None:
        stale = self._live.get(ptr)
        if stale is not None:  # an older storage resized away from this address: its bytes were given back
            self.current_bytes -= stale[1]
        self._serial += 1
        nbytes = storage.nbytes()
        # A weakref callback per storage (not weakref.finalize: its registry costs several times more).
        self._live[ptr] = (self._serial, nbytes, weakref.ref(storage, partial(self._freed, ptr, self._serial)))
        self.current_bytes += nbytes
        if self.current_bytes > self.window_peak_bytes:
            self.window_peak_bytes = self.current_bytes
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _freed(self, ptr: int, serial: int, _ref: weakref.ref) -> None:
        entry = self._live.get(ptr)
        if entry is not None and entry[0] == serial:
            del self._live[ptr]
            self.current_bytes -= entry[1]

    def bind_weights(self, weights: list[torch.Tensor], shapes: list[tuple[int, int]] | None = None) -> None:
        """Register the model's linear weights as layers 0, 1, ... by storage and object (once per run), with
        their shapes (`shapes` where the Parameters hold flat shards)."""
        if self.layers.weight_keys:
            return
        for k, weight in enumerate(weights):
            ptr = _data_ptr(weight)
            self._weight_ptrs.add(ptr)
            if (axes := weight_axes.weight_axes(weight)) is not None:
                self._axes[("pre", ptr)] = axes
            layer = self.layers.add_layer(("pre", ptr), tuple(shapes[k] if shapes else weight.shape), None)
            self.layers.alias_weight(layer, ("pre", ptr), weight)
            if ptr is not None:  # a wrapper subclass (a sharded DTensor) has no view to key
                self.layers.weight_views.setdefault((("pre", ptr), weight.storage_offset(), weight.numel()), layer)
        self._bound = bool(weights)

    def weight_layer_of(self, t: torch.Tensor) -> int | None:
        """The layer whose weight `t` is (or was copied from): by the bound weight's exact view, by its Parameter
        object, else by storage. Views and objects first: an engine that flattens the trainable Parameters into one
        buffer (DeepSpeed ZeRO-1/2) leaves every weight on the same storage, and a checkpoint's recompute hands
        backward detached views of them (no Parameter behind)."""
        view = self.root_view(t)
        if (layer := self.layers.layer_of_weight_view(view)) is not None:
            return layer
        if (param := param_of(t)) is not None and (layer := self.layers.layer_of_param(param)) is not None:
            return layer
        return self.layers.layer_of_weight(view[0])

    def _adopt(self, weight: torch.nn.Parameter) -> int | None:
        """The layer of a forward GEMM's Parameter operand not seen before. Bound: a wrapper's unsharded copy of
        a bound weight, i.e. the first bound layer of that shape yet to run forward (layers run in order); None if
        there is none. Unbound: the next layer."""
        key = self.key(weight)
        if not self._bound:
            layer = self.layers.add_layer(key, tuple(weight.shape), None)
        else:
            layer = next((i for i, shape in enumerate(self.layers.weight_shapes)
                          if shape == tuple(weight.shape) and self.layers.input_shapes[i] is None), None)
            if layer is None:
                return None
        self.layers.alias_weight(layer, key, weight)
        return layer

    def _learn_layer(self, args: tuple, out: torch.Tensor) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)][-2:]  # the two GEMM operands
        bound = [(i, self.weight_layer_of(t)) for i, t in enumerate(tensors)]
        bound = [(i, layer) for i, layer in bound if layer is not None]
        if len(bound) == 1:  # one operand is a known weight
            slot, layer = bound[0]
        else:
            params = [(i, p) for i, p in enumerate(param_of(a) for a in tensors) if p is not None and p.dim() == 2]
            if len(params) != 1:
                return
            slot, weight = params[0]
            layer = self._adopt(weight)
            if layer is None:
                return
        other = tensors[1 - slot]
        self.layers.output_views.setdefault(self.view_key(out), layer)
        self.layers.set_input_shape(layer, tuple(other.shape))
        view = self.root_view(other)
        region = self._region(other, view)
        data = region.read() if region is not None else None  # a copy's source: its data, not the copy's
        self.layers.add_input(layer, self.key(other), view, fingerprint(data) if data is not None else None)
        if data is not None:
            self.layers.add_region(region, view)

    def _region(self, t: torch.Tensor, view: tuple) -> extents.Extent | None:
        """The bytes `view` (t's root view) covers: t's own where t is that view, its copy's source's where t is a
        followed copy (or a view of one) of it; None for a wrapper subclass (DTensor: no plain storage)."""
        if type(t) is not torch.Tensor:
            return None
        key = self.key(t)
        return extents.extent_of(key, t) if view == self.view_key(t) else self._extents.get(key)

    def input_layers_overlapping(self, t: torch.Tensor) -> frozenset:
        """Layers whose forward input (or the source of the copy that GEMM read) shares bytes with `t`, or with the
        source of the copy `t` views, and still holds the data it held then: a slice of a layer's input (a K-slice
        in a split-K GEMM), or a cast of one, is that layer's input."""
        probe = self._region(t, self.root_view(t)) if type(t) is torch.Tensor else None
        if probe is None:
            return frozenset()
        found = frozenset()
        for view, whole in extents.overlapping(self.layers.input_regions.get(probe.key, ()), probe):
            found |= self.layers.layers_of_input_view(view, fingerprint(whole))
        return found

    def set_phase(self, name: str) -> None:
        """Idle pops the mode off the stack (when it is on top), so the harness's snapshots pay no dispatch."""
        self.phase = name
        self.counting = name != "idle"
        if not self.counting and not self._paused and _get_current_dispatch_mode() is self:
            super().__exit__(None, None, None)
            self._paused = True
        elif self.counting and self._paused:
            super().__enter__()
            self._paused = False

    def new_iteration(self) -> None:
        """A later training iteration's probes start: bound layers forget the inputs the last one learnt (unbound,
        the layers learnt are kept: they name the weights); storages, copies and live bytes carry on."""
        if self._bound:
            self.layers = self.layers.weights_only()

    def close(self) -> None:
        """Pop the mode (unless paused) and stop tracking frees: the run is over and the figures are taken."""
        if not self._paused:
            self.__exit__(None, None, None)
        self._paused = False
        self._live, self._seen = {}, {}  # dropping the weakrefs cancels their callbacks


_ACTIVE: list[Watcher] = []  # the running watcher, if any
