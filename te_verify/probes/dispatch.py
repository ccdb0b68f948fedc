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
  alias, unlike data pointers, which the allocator reuses once a storage is freed. A storage that no dispatched
  op allocated (inductor allocates its buffers in C++) is noted the first time it is keyed, whatever asks (a GEMM
  operand, a GEMM's out= buffer, a tex operand): one at an address where another such storage was keyed before is
  keyed ("pre", data_ptr, generation). Noting only some (once only GEMM operands) let a buffer first keyed as a
  GEMM's output share ("pre", data_ptr) with an earlier, dead one there: attribution then hung on the allocator.
- Phase "idle" (set by a runner around its own snapshots) pauses all of it: the mode is popped off the stack,
  so the harness's copies pay no dispatch either.
- Cost: a Python dispatch hook costs a few microseconds per aten op whatever it does (about 2.5x the step
  time of the pr tier's 0.2 ms stacks for a do-nothing mode); the hook below keeps its own work to a few
  dict lookups per op, so the probes' overhead is per op, not per FLOP.
- Copies (opt-in, `follow_copies`): a fresh tensor made by a non-GEMM op from exactly one tensor of the same size,
  all other tensor arguments being scalars (a cast, a scale, a quantize or dequantize, a contiguous copy), is
  traced back to it, so a GEMM on an FP8-rounded copy of a weight or activation still names them. Off by
  default: it costs a few more lookups per op.
- Layers: probes that know the model bind its linear weights (`bind_weights`, in layer order), and a forward GEMM
  with an operand on a weight's storage (the Parameter itself or any view or reinterpretation of it, as
  inductor's compiled code passes it) or on the weight's Parameter object (FSDP swaps its storage) is that
  layer's; its other operand is the layer's input (a backward GEMM on a slice of it, as split-K reads rows, or on a
  copy of a slice, is found by overlapping bytes of the input or of the copy's source: probes.extents; checked to
  still hold that input's data). A Parameter operand of no bound layer (a
  sharded wrapper's unsharded copy) is the first bound layer of its shape yet to run forward. Unbound, the k-th
  distinct Parameter used as a forward GEMM operand is the weight of layer k.
"""
from __future__ import annotations

import contextlib
import weakref
from functools import partial
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from te_verify.probes import extents, weight_axes
from te_verify.probes.layer_map import LayerMap, StorageKey
from te_verify.probes.conv_gemms import CONV_OPS, conv_gemms

aten = torch.ops.aten
# Every GEMM-family aten op, with the positions of its two operands. Keyed by overload packet, so every overload
# counts: out= (mm.out: inductor's extern kernels write into their buffers), dtype variants; the in-place ops are
# packets of their own (addmm_). matmul, linear and einsum are composite: they reach dispatch as these. A GEMM whose
# result is thrown away is counted all the same: it is work.
GEMM_OPERANDS: dict[Any, tuple[int, int]] = {
    aten.mm: (0, 1), aten.bmm: (0, 1), aten.addmm: (1, 2), aten.addmm_: (1, 2), aten.baddbmm: (1, 2),
    aten.baddbmm_: (1, 2), aten.addbmm: (1, 2), aten.addbmm_: (1, 2), aten._addmm_activation: (1, 2),
    aten.mv: (0, 1), aten.addmv: (1, 2), aten.addmv_: (1, 2), aten._scaled_mm: (0, 1), aten._int_mm: (0, 1),
}
GEMM_OPS = frozenset(GEMM_OPERANDS)
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


def _data_ptr(t: torch.Tensor) -> int | None:
    """The tensor's storage address; None for a wrapper subclass without storage of its own (a sharded DTensor
    parameter: its layer is then known by object and shape)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def is_real(t: torch.Tensor) -> bool:
    """False for tensors a compiler traces with (FakeTensor, meta): their work is not the run's."""
    return not t.is_meta and not isinstance(t, FakeTensor)


def param_of(t: torch.Tensor) -> torch.nn.Parameter | None:
    if isinstance(t, torch.nn.Parameter):
        return t
    return t._base if isinstance(t._base, torch.nn.Parameter) else None


# What an op's outputs are, from its schema, cached per op (see _op_info): bit flags.
_FRESH = 1  # no return aliases an argument: every output storage is a new allocation (or an old one of ours)
_SCAN = 2  # some return may alias an argument: an output is new only if no argument shares its storage
_GEMM = 4  # one of GEMM_OPS: learn layers and tell the listeners
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


def gemm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """2*m*k*n (torch.utils.flop_counter's formula) from the operands: a is (..., m, k), b is (..., k, n) or a
    vector (n = 1); batch dims count (bmm, and addbmm, whose output has none)."""
    rows = a.numel() // a.shape[-1] if a.shape[-1] else 0
    return 2 * rows * a.shape[-1] * (b.shape[-1] if b.dim() >= 2 else 1)


class Watcher(TorchDispatchMode):
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

    def key(self, t: torch.Tensor) -> StorageKey:
        """The key of `t`'s storage, noting it first (`_see`), so no two storages ever keyed share one."""
        self._see(t)
        return self.key_of_storage(t.untyped_storage())

    def view_key(self, t: torch.Tensor) -> tuple:
        """A tensor as a view: (storage key, storage offset, numel); a transpose or reshape keeps it."""
        return (self.key(t), t.storage_offset(), t.numel())

    def root_view(self, t: torch.Tensor) -> tuple:
        """The view a tensor was copied from, through every copy followed (itself when none was). Keyed by the
        copy's storage, not its view: a slice or broadcast of a copy (split-K's halves, matmul's expand for bmm) is
        still a view of what it copies."""
        view = self.view_key(t)
        return self._derived.get(view[0], view)

    def _note_copy(self, out: torch.Tensor, args: tuple) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor) and is_real(a)]
        sources = [a for a in tensors if a.numel() == out.numel()]
        if len(sources) == 1 and all(a.numel() <= 1 for a in tensors if a is not sources[0]):
            key, source_key = self.key(out), self.key(sources[0])
            self._derived[key] = self.root_view(sources[0])
            self._extents[key] = self._extents.get(source_key) or extents.extent_of(source_key, sources[0])
            source_axes = self._axes.get(self.key(sources[0]))
            axes = weight_axes.copy_axes(sources[0], source_axes, out) if source_axes else None
            if axes is not None:
                self._axes[key] = axes

    def axes_of(self, t: torch.Tensor) -> weight_axes.Axes | None:
        """Where a weight's axes lie in `t`'s storage (probes.weight_axes): a weight's or a followed copy's; row-major
        for a weight storage not bound (a wrapper's unsharded copy); None for a copy whose layout was lost."""
        key = self.key(t)
        axes = self._axes.get(key)
        return axes if axes is not None or key in self._derived else (1, 0)  # row-major: in-features at unit stride

    def key_of_storage(self, storage: torch.UntypedStorage) -> StorageKey:
        """The serial (an int) of a storage made during the run, else ("pre", data_ptr[, generation]): a storage
        not noted (`_see`) yet reads as its address's first, so keys go through `key`."""
        ptr = storage.data_ptr()
        entry = self._tracked(storage, ptr)
        if entry is not None:
            return entry[0]
        seen = self._seen.get(ptr)
        if seen is not None and seen[0] and seen[1]() is storage:
            return ("pre", ptr, seen[0])
        return ("pre", ptr)

    def _see(self, t: torch.Tensor) -> None:
        """Note a keyed storage that no dispatched op allocated. The first storage object seen at an address
        keeps the key ("pre", ptr); a later one there (a compiled kernel's buffer reusing a dead one's memory) gets
        ("pre", ptr, generation), so it is not taken for the earlier one. Not a new allocation for the byte
        figures: nothing dispatched made it."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        seen = self._seen.get(ptr)
        if (ptr == 0 or self._tracked(storage, ptr) is not None or (seen is not None and seen[1]() is storage)
                or ptr in self._weight_ptrs or param_of(t) is not None):
            return
        self._seen[ptr] = (0 if seen is None else seen[0] + 1, weakref.ref(storage))

    def _tracked(self, storage: torch.UntypedStorage, ptr: int) -> tuple | None:
        """The live entry of this storage object at `ptr`; None for another object there (one whose memory an
        older storage gave back with resize_(0), as FSDP frees gathered parameters, is a new allocation)."""
        entry = self._live.get(ptr)
        return entry if entry is not None and entry[2]() is storage else None

    @property
    def storages_made(self) -> int:
        """How many storages ops made since the watcher was pushed (the serial of the latest)."""
        return self._serial

    def live_storages(self, since: int = 0) -> list[tuple[int, int]]:
        """(data_ptr, nbytes) of the storages made after the `since`-th that are still alive."""
        return [(ptr, entry[1]) for ptr, entry in self._live.items() if entry[0] > since and entry[2]() is not None]

    def live_serials(self) -> set[int]:
        """Keys (serials) of the storages ops made that are still alive."""
        return {entry[0] for entry in self._live.values() if entry[2]() is not None}

    def is_new(self, t: torch.Tensor) -> bool:
        storage = t.untyped_storage()
        return self._tracked(storage, storage.data_ptr()) is not None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # _skip_dynamo_in_dispatch below does it without a wrapper frame per op

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
                self.layers.weight_views[(("pre", ptr), weight.storage_offset(), weight.numel())] = layer
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


def _run_hop_under(hop: Any, mode: Watcher, *args: Any, **kwargs: Any) -> Any:
    """A higher-order operator reaching the watcher: its body's ops run with the watcher on the mode stack (so their
    GEMMs and allocations count), through the HOP's own kernel for the device (no rule of its own for this mode)."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    key = torch._C.DispatchKey.CUDA if any(t.is_cuda for t in tensors) else torch._C.DispatchKey.CPU
    with mode:
        return hop.dispatch(key, *args, **kwargs)


def _register_rng_hops() -> None:
    """torch.compile wraps a checkpointed region's random ops in run_and_save_rng_state / run_with_rng_state
    (torch._prims.rng_prims); a dispatch mode needs a rule for each, or the compiled run raises."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    for hop in (run_and_save_rng_state, run_with_rng_state):
        if Watcher not in hop.python_key_table:
            hop.py_impl(Watcher)(partial(_run_hop_under, hop))


def _skip_dynamo_in_dispatch() -> None:
    """Keep dynamo out of the dispatch hook and all it calls, as TorchDispatchMode's own per-call
    torch._disable_dynamo wrapper does, by marking the code object once (recursive skip): the wrapper costs two
    Python frames and four eval-frame switches per op. Falls back to the wrapper if that API is gone."""
    code = Watcher.__torch_dispatch__.__code__
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    except (ImportError, AttributeError):
        Watcher.__torch_dispatch__ = torch._disable_dynamo(Watcher.__dict__["__torch_dispatch__"], recursive=True)


_ACTIVE: list[Watcher] = []  # the running watcher, if any
_SUBSCRIBERS: list[object] = []
_DYNAMO_SKIPPED: list[bool] = []  # non-empty once _skip_dynamo_in_dispatch ran


def subscribe(probe: object) -> Watcher:
    """Join the shared watcher, pushing it on the dispatch-mode stack if this is the first probe."""
    if not _SUBSCRIBERS:
        if not _DYNAMO_SKIPPED:
            _skip_dynamo_in_dispatch()
            _register_rng_hops()
            _DYNAMO_SKIPPED.append(True)
        watcher = Watcher()
        watcher.__enter__()
        _ACTIVE.append(watcher)
    _SUBSCRIBERS.append(probe)
    return _ACTIVE[-1]


def unsubscribe(probe: object) -> None:
    """Leave the shared watcher; the last probe out pops the mode."""
    _SUBSCRIBERS.remove(probe)
    if not _SUBSCRIBERS:
        _ACTIVE.pop().close()


def set_phase(name: str) -> None:
    if _ACTIVE:
        _ACTIVE[-1].set_phase(name)


def new_iteration() -> None:
    """Tell the running watcher a later iteration's probes start (Watcher.new_iteration)."""
    if _ACTIVE:
        _ACTIVE[-1].new_iteration()


@contextlib.contextmanager
def session(enabled: bool = True) -> Iterator[None]:
    """One watcher kept over every iteration of a probed run (each iteration's probes join it): storage keys and the
    copies followed carry over, so a cache made in iteration 1 and read in iteration 3 is known for what it is."""
    holder = object()
    if enabled:
        subscribe(holder)
    try:
        yield
    finally:
        if enabled:
            unsubscribe(holder)


@contextlib.contextmanager
def idle() -> Iterator[None]:
    """The "idle" phase for a probe's own copies made inside the run (a tex wrapper's), then the phase it was in."""
    before = _ACTIVE[-1].phase if _ACTIVE else None
    set_phase("idle")
    try:
        yield
    finally:
        if before is not None:
            set_phase(before)
