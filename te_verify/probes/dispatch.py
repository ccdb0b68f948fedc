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

Where each part lives: the Watcher (probes.watcher), its storage keys (probes.storage_keys), the GEMM ops it counts
(probes.gemm_ops); here, the one shared watcher its probes subscribe to.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Iterator

import torch

from te_verify.probes.watcher import _ACTIVE, Watcher


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
