"""CPU stand-ins for a library's two CUDA RNG helpers, `_get_cuda_rng_state(device, clone, graph_safe)` and
`_set_cuda_rng_state(new_state, device, graph_safe)`, as TE's and Megatron-core's activation checkpoints call them.

Both checkpoints save and restore the CUDA RNG state around each forward and recompute, unconditionally, beside the
CPU one they also save (`torch.get_rng_state()`); on a torch built without CUDA the first call raises "Torch not
compiled with CUDA enabled". On the CPU run the random state a block's ops draw from is the CPU generator's, so the
stand-ins answer with it: the plain call (no device index, no clone, graph_safe False) its state, and nothing else,
which raises naming itself.

A step may also cover the graph-safe call (graph_safe True, TE's default: LayerNormMLP's checkpoint makes it). On a
GPU it answers `graphsafe_get_state()`, a Generator that points at the CUDA generator's live state (torch's
CUDAGeneratorImpl shares its `state_`, it copies nothing), and `graphsafe_set_state` points the generator at a
state. The CPU run has one live state and no `clone_state`, so the stand-in answers LIVE, the pointer to it, and
setting LIVE back sets nothing, as on a GPU: the checkpoint's own restore of the CPU generator is what replays the
forward's random stream in the recompute. A clone (a new state: TE's RNG tracker) is not covered.

Each library's step (compat.te_checkpoint_cpu, compat.megatron_checkpoint_cpu) says where the helpers live, which
modules import them by name and which release they were written for; installing checks the helpers' signatures and
those imports first, so a release that changed them is refused, not patched blindly.
"""
from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Callable

import torch

# The helpers' parameters as TE 2.20.2 and megatron-core 0.16.1 declare them: what the stand-ins replace.
SIGNATURES = {"_get_cuda_rng_state": ("device", "clone", "graph_safe"),
              "_set_cuda_rng_state": ("new_state", "device", "graph_safe")}


class CudaRngStepError(RuntimeError):
    """A library asked a CPU stand-in for something it does not cover, or its helpers are not the ones the step
    was written for."""


class LiveState:
    """The graph-safe RNG state on the CPU run: a pointer to the CPU generator's live state (there is one)."""

    def __repr__(self) -> str:
        return "<te_verify LiveState: the CPU generator's live state>"


LIVE = LiveState()


def _cuda_default(device) -> bool:
    return device in ("cuda", -1) or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None)


def stand_ins(module: str, graph_safe_calls: bool = False) -> dict[str, Callable]:
    """The two stand-ins, their refusals naming `module`; `graph_safe_calls`: the graph-safe call is covered too."""
    covered = "graph_safe=False or True (the live state)" if graph_safe_calls else "graph_safe=False"

    def refuse(call: str) -> CudaRngStepError:
        return CudaRngStepError(f"{module}.{call} on CPU: te_verify's CPU RNG step covers only the default device, "
                                f"clone=False and {covered} (no graph-safe RNG tracker)")

    def get_state(device="cuda", clone: bool = False, graph_safe: bool = True) -> torch.Tensor | LiveState:
        if not _cuda_default(device) or clone or (graph_safe and not graph_safe_calls):
            raise refuse(f"_get_cuda_rng_state(device={device!r}, clone={clone}, graph_safe={graph_safe})")
        return LIVE if graph_safe else torch.get_rng_state()

    def set_state(new_state: torch.Tensor | LiveState, device=-1, graph_safe: bool = True) -> None:
        call = f"_set_cuda_rng_state({type(new_state).__name__}, device={device!r}, graph_safe={graph_safe})"
        if not _cuda_default(device) or (graph_safe and not graph_safe_calls):
            raise refuse(call)
        if not graph_safe:
            torch.set_rng_state(new_state)
        elif new_state is not LIVE:  # graph-safe: only LIVE, whose set changes nothing (the state already in use)
            raise refuse(call)

    return {"_get_cuda_rng_state": get_state, "_set_cuda_rng_state": set_state}


def _check_signatures(module: ModuleType, written_for: str) -> None:
    for name, params in SIGNATURES.items():
        found = tuple(inspect.signature(getattr(module, name)).parameters)
        if found != params:
            raise CudaRngStepError(f"{module.__name__}.{name}{found} is not the {params} the CPU RNG step replaces "
                                   f"(written for {written_for}); its checkpoint cannot run on CPU with it")


def _importers(module: ModuleType, names: tuple[str, ...], written_for: str) -> list[ModuleType]:
    """The modules that bound the helpers by `from module import` (they keep the originals unless patched too)."""
    importers = [importlib.import_module(name) for name in names]
    for importer in importers:
        for helper in SIGNATURES:
            if getattr(importer, helper, None) is not getattr(module, helper):
                raise CudaRngStepError(f"{importer.__name__}.{helper} is not {module.__name__}'s (written for "
                                       f"{written_for}): the CPU RNG step would leave it unreplaced")
    return importers


def install(module_name: str, written_for: str, importers: tuple[str, ...] = (),
            graph_safe_calls: bool = False) -> bool:
    """Install the stand-ins in `module_name` and in the `importers` that bound its helpers by name (idempotent: False
    when already there); raises where CUDA is present (the real helpers serve it) or the helpers are not what the step
    replaces (`written_for`: the release it was measured on, for the message)."""
    if torch.cuda.is_available():
        raise CudaRngStepError(f"the CPU RNG step for {module_name} is for the CPU run only: CUDA is available")
    module = importlib.import_module(module_name)
    if getattr(module._get_cuda_rng_state, "__te_verify_step__", False):
        return False
    _check_signatures(module, written_for)
    targets = [module, *_importers(module, importers, written_for)]
    for name, stand_in in stand_ins(module_name, graph_safe_calls).items():
        stand_in.__te_verify_step__ = True
        for target in targets:
            setattr(target, name, stand_in)
    return True
