"""The process state a case can change, as a table (SETTINGS): each setting says how to read it, how to put it back
and what a run that changed it left ("left grad mode disabled"). `kept()` snapshots the table before a run and,
after it, restores whatever changed and names it; `watched(record, spec)` does so around one run of a case
(runner.run_case, run.microbatch.run_microbatches), after isolation.fresh_case, so the next run of the case
(eager reference, backend, fp64 truth) starts from the same state and the record says what the run left
(checks.leftovers.process_state judges it). The plugin keeps each test's call the same way.

Judged: grad, inference and anomaly mode; the default dtype and device; deterministic algorithms; the intra-op
thread count (the inter-op count cannot change once work has run: torch raises); float32 precision (the legacy
matmul precision and the per-backend fp32_precision table); autocast (nesting, CPU and CUDA enabled and dtype, the
cast cache); cuDNN/mkldnn/cuBLAS flags; the torch-function and dispatch mode stacks and torch's callables (the
`torch` namespace, torch.nn.functional, the methods of torch.Tensor and of torch.nn's module classes:
te_verify.run.torch_routing); TE's FP8 autocast state (TE's FP8GlobalStateManager and te_verify.te.reference's, not
the amax/scale buffers fresh_case resets); TE's graph-capture flag (make_graphed_callables'). Restored but not judged:
the global RNG (CPU, and CUDA once initialised), which every run may draw from.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from te_verify.run import torch_routing as routing
from te_verify.run.isolation import fp8_autocast_state, fp8_unset, fresh_case, set_fp8_autocast_state
from te_verify.record import Record
from te_verify.spec import CaseSpec


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else routing.qualified(value) if callable(value) else str(value)


def _switch(name: str) -> Callable[[Any, Any], str | None]:
    """A mode that is on or off: 'left grad mode disabled'."""
    return lambda before, now: None if now == before else f"left {name} {'enabled' if now else 'disabled'}"


def _value(name: str) -> Callable[[Any, Any], str | None]:
    """One value: 'left the default dtype torch.float64 (was torch.float32)'."""
    return lambda before, now: None if now == before else f"left {name} {_show(now)} (was {_show(before)})"


def _parts(name: str, unset: Callable[[Any], Any] = lambda part: None) -> Callable[[dict, dict], str | None]:
    """A setting of several parts, each named where it changed; a part absent before (its module was not loaded)
    is compared with `unset(part)`."""
    def left(before: dict, now: dict) -> str | None:
        changed = [f"{part} {_show(value)} (was {_show(before.get(part, unset(part)))})" for part, value in now.items()
                   if value != before.get(part, unset(part))]
        return f"left {name}: {', '.join(changed)}" if changed else None
    return left


@dataclass(frozen=True)
class Setting:
    """One piece of process state a case can change."""

    # What a failure message calls it ("grad mode").
    name: str
    # Its value now (a dict of parts for a setting of several).
    read: Callable[[], Any]
    # Put a value `read` returned back.
    restore: Callable[[Any], None]
    # (before, now) -> what a run that changed it left ("left grad mode disabled"), None where unchanged.
    left: Callable[[Any, Any], str | None]
    # False: restored after every run but never a fault (the RNG: a run may draw from it).
    judged: bool = True


# Guards that switched a leaked inference mode off: torch restores the mode when one is destroyed, so they are kept.
_INFERENCE_GUARDS: list = []


def _set_inference_mode(enabled: bool) -> None:
    guard = torch._C._InferenceMode(enabled)
    guard.__enter__()
    _INFERENCE_GUARDS.append(guard)


def _anomaly() -> dict:
    return {"enabled": torch.is_anomaly_enabled(), "check_nan": torch.is_anomaly_check_nan_enabled()}


def _set_default_device(device: torch.device) -> None:
    torch.set_default_device(None if device == torch.device("cpu") else device)  # cpu: torch's own, no mode pushed


def _deterministic() -> dict:
    return {"enabled": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}


# torch's fp32_precision table (torch >= 2.9) by (backend, op); set_float32_matmul_precision writes its matmul rows.
PRECISION_ROWS = (("generic", "all"), *((backend, op) for backend in ("cuda", "mkldnn")
                                         for op in ("all", "matmul", "conv", "rnn")))


def _precision() -> dict:
    parts = {}
    with contextlib.suppress(RuntimeError):  # torch raises where legacy and per-backend settings were mixed: the
        parts["matmul precision"] = torch.get_float32_matmul_precision()  # per-backend rows then say what changed
    if hasattr(torch._C, "_get_fp32_precision_getter"):
        parts.update({f"{b} {op}": torch._C._get_fp32_precision_getter(b, op) for b, op in PRECISION_ROWS})
    return parts


def _set_precision(parts: dict) -> None:
    if "matmul precision" in parts:
        torch.set_float32_matmul_precision(parts["matmul precision"])
    for b, op in PRECISION_ROWS:
        if f"{b} {op}" in parts:
            torch._C._set_fp32_precision_setter(b, op, parts[f"{b} {op}"])


AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_nesting() -> int:
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting()


def _autocast() -> dict:
    parts = {"nesting": _autocast_nesting(), "cache enabled": torch.is_autocast_cache_enabled()}
    for device in AUTOCAST_DEVICES:
        parts.update({f"{device} enabled": torch.is_autocast_enabled(device),
                      f"{device} dtype": torch.get_autocast_dtype(device)})
    return parts


def _set_autocast(parts: dict) -> None:
    while _autocast_nesting() > parts["nesting"]:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()  # as autocast's own exit does: the cast weights go with the last region
    while _autocast_nesting() < parts["nesting"]:
        torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(parts["cache enabled"])
    for device in AUTOCAST_DEVICES:
        torch.set_autocast_enabled(device, parts[f"{device} enabled"])
        torch.set_autocast_dtype(device, parts[f"{device} dtype"])


# Backend flags by the name a message gives them: (module, attribute).
FLAGS = {"cudnn.enabled": (torch.backends.cudnn, "enabled"), "cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
         "cudnn.deterministic": (torch.backends.cudnn, "deterministic"),
         "mkldnn.enabled": (torch.backends.mkldnn, "enabled"),
         "cuda.matmul.allow_fp16_reduced_precision_reduction":
             (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
         "cuda.matmul.allow_bf16_reduced_precision_reduction":
             (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction")}


def _set_flags(parts: dict) -> None:
    for name, value in parts.items():
        module, attr = FLAGS[name]
        if getattr(module, attr) != value:
            setattr(module, attr, value)


def _rng() -> dict:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None}


def _set_rng(states: dict) -> None:
    torch.set_rng_state(states["cpu"])
    if states["cuda"] is not None:
        torch.cuda.set_rng_state_all(states["cuda"])


TE_GRAPH_MODULE = "transformer_engine.pytorch.graph"


def _te_graph_capturing() -> bool:
    """TE's make_graphed_callables flag (graph.py `_IS_GRAPH_CAPTURING`): set at its capture's start and cleared only
    after the capture succeeds, so a capture that raises (over the emulation: torch.cuda.CUDAGraph is refused) leaves
    it set for every later case. False while TE's graph module is not loaded (its value on import)."""
    return bool(getattr(sys.modules.get(TE_GRAPH_MODULE), "_IS_GRAPH_CAPTURING", False))


def _set_te_graph_capturing(capturing: bool) -> None:
    graph = sys.modules.get(TE_GRAPH_MODULE)
    if graph is not None and hasattr(graph, "_IS_GRAPH_CAPTURING"):
        graph._IS_GRAPH_CAPTURING = capturing


# Restored in this order: inference mode before grad mode (leaving inference mode also switches grad mode back); the
# default device before the mode stacks (torch.set_default_device keeps its device on the torch-function stack).
SETTINGS = (
    Setting("inference mode", torch.is_inference_mode_enabled, _set_inference_mode, _switch("inference mode")),
    Setting("grad mode", torch.is_grad_enabled, torch._C._set_grad_enabled, _switch("grad mode")),
    Setting("anomaly mode", _anomaly, lambda v: torch.set_anomaly_enabled(v["enabled"], v["check_nan"]),
            _parts("anomaly mode")),
    Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype, _value("the default dtype")),
    Setting("default device", torch.get_default_device, _set_default_device, _value("the default device")),
    Setting("deterministic algorithms", _deterministic,
            lambda v: torch.use_deterministic_algorithms(v["enabled"], warn_only=v["warn_only"]),
            _parts("deterministic algorithms")),
    Setting("intra-op threads", torch.get_num_threads, torch.set_num_threads, _value("the intra-op thread count")),
    Setting("float32 precision", _precision, _set_precision, _parts("float32 precision")),
    Setting("autocast", _autocast, _set_autocast, _parts("autocast")),
    Setting("backend flags", lambda: {name: getattr(m, a) for name, (m, a) in FLAGS.items()}, _set_flags,
            _parts("backend flags")),
    Setting("torch-function modes", routing.function_modes, routing.set_function_modes,
            routing.stack_left("torch-function")),
    Setting("dispatch modes", routing.dispatch_modes, routing.set_dispatch_modes, routing.stack_left("dispatch")),
    Setting("torch's callables", routing.callables, routing.set_callables, routing.callables_left),
    Setting("FP8 autocast state", fp8_autocast_state, set_fp8_autocast_state, _parts("FP8 autocast state", fp8_unset)),
    Setting("TE graph capture", _te_graph_capturing, _set_te_graph_capturing, _switch("TE's graph capture")),
    Setting("global RNG", _rng, _set_rng, lambda before, now: None, judged=False),
)


def snapshot() -> dict[str, Any]:
    """Every setting's value now, by name."""
    return {s.name: s.read() for s in SETTINGS}


@dataclass
class Leftovers:
    """What a run left in the process state, found (and undone) by `restore`."""

    # One message per judged setting the run changed ("left grad mode disabled"), in SETTINGS order.
    messages: list[str] = field(default_factory=list)
    # How many judged settings were compared.
    compared: int = 0


def restore(before: dict[str, Any]) -> Leftovers:
    """Compare every setting with `before`, put back each that changed (and every unjudged one), and name what the
    judged ones left. Each is read just before it is compared, after the ones before it were restored, so one leak
    is named once (inference mode, not also the grad mode it switched off)."""
    found = Leftovers()
    for setting in SETTINGS:
        now = setting.read()
        left = setting.left(before[setting.name], now)
        if setting.judged:
            found.compared += 1
            if left is not None:
                found.messages.append(left)
        if left is not None or not setting.judged:
            setting.restore(before[setting.name])
    return found


@contextlib.contextmanager
def kept() -> Iterator[Leftovers]:
    """Snapshot the process state; on exit (a raise included) restore it; the yielded Leftovers then name what the
    block left."""
    before = snapshot()
    found = Leftovers()
    try:
        yield found
    finally:
        after = restore(before)
        found.messages[:], found.compared = after.messages, after.compared


@contextlib.contextmanager
def watched(record: Record, spec: CaseSpec | None = None) -> Iterator[None]:
    """One run of a case: the process first put in the state every case starts from (isolation.fresh_case, where
    `spec` is given), then kept; what the run left goes to `record.process_left` (and the count compared to
    `record.process_compared`), undone before anything else runs."""
    if spec is not None:
        fresh_case(spec)
    with kept() as found:
        yield
    record.process_left, record.process_compared = found.messages, found.compared
