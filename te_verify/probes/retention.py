"""What a second training step leaves in memory once it is over: memory a backend keeps growing step after step (a
cache gaining an entry per call, a TE build appending per step).

After the measured step, with its output and graph dropped, the runner runs one more plain step (forward, one
backward) on the same input and drops its output. Its net growth, live bytes after it minus live bytes before it,
must be zero: eager's AccumulateGrad adds the second step's gradients into the first's in place, so eager's is zero,
and what a backend makes once on first use (compiled code and its constants, TE's process-wide workspace, FP8 scaling
state) the measured step made already, while what it remakes every step (a cast or transposed weight cache) frees
the previous step's. Judging the second step's growth rather than what the first left keeps first-use allocations
out of the verdict and keeps it independent of which case ran before (a process-wide cache an earlier case made is
missing from this case's first step only).

What is measured. On a CUDA run device: the allocator's net growth (memory_allocated after the step minus before).
On CPU: the shared dispatch Watcher's live bytes, tracked from the measured step on (Retention is entered before the
probes and left after the second step): what dispatched ops made and is still alive, frees of what they made
before netted. Inductor allocates its own buffers in C++ outside the dispatcher, so on CPU what compiled code keeps
in such buffers is not seen; what it keeps through a dispatched op is.

Cost: one step per probed run (the references run unprobed and pay nothing); gc.collect() runs only when something
is left, to tell a reference cycle awaiting collection from a holder. Its collections scan only what the case made
from the measured step on: Retention freezes every older object (gc.freeze) while it is entered, so a collection
costs the same on a worker's first case as on its 6,000th (unfrozen, a full collection walks every object the worker
has kept: four per judged iteration outran the case timeout on a nightly's old worker). What this leaves out: a
cycle made before the measured step that becomes garbage during a judged step while holding a storage made in it;
it is counted as held.
"""
from __future__ import annotations

import gc
import time
import types
from typing import Any, Callable, Iterator

import torch

from te_verify import device as run_device
from te_verify.models import CaseInputs
from te_verify.probes import dispatch
from te_verify.probes.storage_keys import _data_ptr
from te_verify.probes.watcher import Watcher

SETTLE_LOOKS = 4  # gc, then up to three short waits for a communication thread's release
SETTLE_WAIT_S = 0.02
HOLDER_DEPTH = 6  # attribute hops searched from the model and the backend's callable to name what holds a storage


def _step(fn: Callable, inputs: CaseInputs) -> None:
    """One plain training step; returning drops its output and with it the graph."""
    fn(inputs.x).backward(inputs.grad_output)


def _children(path: str, obj: Any) -> Iterator[tuple[str, Any]]:
    """What an object refers to, by the path a reader would write: a module's attributes, submodules and its
    parameters' gradients, a dict's values, a sequence's items, a function's closure cells, any other object's
    attributes."""
    if isinstance(obj, torch.nn.Module):
        skip = ("_parameters", "_buffers", "_modules")  # registered state is excluded; submodules by name below
        yield from ((f"{path}.{k}", v) for k, v in vars(obj).items() if k not in skip)
        yield from ((f"{path}.{k}", v) for k, v in obj.named_children())
        for k, p in obj.named_parameters(recurse=False):  # a gradient the first step did not have
            yield from ((f"{path}.{k}.{g}", getattr(p, g)) for g in ("grad", "main_grad") if hasattr(p, g))
    elif isinstance(obj, dict):
        yield from ((f"{path}[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    elif isinstance(obj, types.FunctionType):
        cells = zip(obj.__code__.co_freevars, obj.__closure__ or ())
        yield from ((f"{path} (closure {name})", cell.cell_contents) for name, cell in cells if _cell_filled(cell))
    elif isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(obj, (type, types.ModuleType)):
        yield from ((f"{path}.{k}", v) for k, v in vars(obj).items())


def _cell_filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def holders(roots: dict[str, Any], ptrs: set[int]) -> list[str]:
    """Paths from `roots` to tensors on the storages `ptrs` (breadth first, each object once)."""
    found, seen, level = [], set(), list(roots.items())
    for _ in range(HOLDER_DEPTH):
        following = []
        for path, obj in level:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                if _data_ptr(obj) in ptrs:
                    found.append(path)
                continue
            following.extend(_children(path, obj))
        level = following
    return found


class Retention:
    """Entered before the probes (on CPU it keeps the shared Watcher from the measured step on); `second_step` runs
    and judges the step after the measured one."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.device = run_device.active()
        self._watcher: Watcher | None = None
        self._froze = False

    def __enter__(self) -> "Retention":
        if self.enabled and self.device.type != "cuda":
            self._watcher = dispatch.subscribe(self)
        if self.enabled and gc.get_freeze_count() == 0:  # an outer freeze (a caller's own) is left as it is
            gc.freeze()
            self._froze = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watcher is not None:
            dispatch.unsubscribe(self)
            self._watcher = None
        if self._froze:
            gc.unfreeze()  # the older objects go back to the oldest generation, collectable again
            self._froze = False

    def _live_bytes(self) -> int:
        if self._watcher is None:
            torch.cuda.synchronize(self.device)
            return torch.cuda.memory_allocated(self.device)
        return self._watcher.current_bytes

    def _settled_growth(self, before: int, expected: int = 0) -> int:
        """Live bytes grown since `before`, once what is about to be freed is: a reference cycle awaiting
        collection, and a finished collective's tensors that gloo's worker thread still holds for a moment after
        wait() returned (ProcessGroupGloo drops its in-progress work after marking it complete). Only paid when
        more than `expected` (growth the step makes by design) is left; a real holder keeps its bytes through every
        look."""
        grown = self._live_bytes() - before
        for look in range(SETTLE_LOOKS):
            if grown <= expected:
                break
            gc.collect()
            if look:
                time.sleep(SETTLE_WAIT_S)
            grown = self._live_bytes() - before
        return grown

    def second_step(self, fn: Callable, model: torch.nn.Module, inputs: CaseInputs,
                    fn_label: str = "the backend's callable", unjudged: int = 0,
                    step: Callable[[CaseInputs], None] | None = None, expected: int = 0) -> dict[str, Any]:
        """Run a plain step after the measured one (whose output the caller dropped), or `unjudged` steps and then
        that one, and return its net growth: `bytes`, the `holders` (attribute paths from the model and `fn`, named
        `fn_label`, CPU) of what it made and left alive, `source`; or `error` when a step raised. `step` replaces the
        plain step (a training engine's whole iteration, its optimizer step included); `expected`: growth it makes by
        design (a freeze schedule's new optimizer state), not waited out."""
        take = step or (lambda inputs: _step(fn, inputs))
        watcher = self._watcher
        if watcher is not None:
            watcher.set_phase("second step")  # tracked like the run's own work; not "forward": no layer is learned
            watcher.follow_copies = False  # no probe reads copies now
        try:
            for _ in range(unjudged):
                take(inputs)
            before, made = self._live_bytes(), watcher.storages_made if watcher is not None else 0
            take(inputs)
        except Exception as exc:  # a backend that cannot take a second step: the check reports it
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        grown = self._settled_growth(before, expected)
        named = []
        if grown > 0 and watcher is not None:
            named = holders({"model": model, fn_label: fn}, {p for p, _ in watcher.live_storages(made)})
        return {"bytes": max(grown, 0), "holders": named,
                "source": "cuda_allocator" if watcher is None else "cpu_storage_tracker"}
