"""CPU stand-ins for a library's two CUDA RNG helpers, `_get_cuda_rng_state(device, clone, graph_safe)` and
`_set_cuda_rng_state(new_state, device, graph_safe)`, as TE's and Megatron-core's activation checkpoints call them.

Both checkpoints save and restore the CUDA RNG state around each forward and recompute, unconditionally, beside the
CPU one they also save (`torch.get_rng_state()`); on a torch built without CUDA the first call raises "Torch not
compiled with CUDA enabled". On the CPU run the random state a block's ops draw from is the CPU generator's, so the
stand-ins answer with it: the call the checkpoints make (no device index, no clone, graph_safe False: no graph-safe
RNG tracker) and nothing else, which raises naming itself. Each library's step (compat.te_checkpoint_cpu,
compat.megatron_checkpoint_cpu) says where the helpers live and which release they were written for; installing
checks the helpers' signatures first, so a release that changed them is refused, not patched blindly.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Callable

import torch

# The helpers' parameters as TE 2.20.2 and megatron-core 0.16.1 declare them: what the stand-ins replace.
SIGNATURES = {"_get_cuda_rng_state": ("device", "clone", "graph_safe"),
              "_set_cuda_rng_state": ("new_state", "device", "graph_safe")}


class CudaRngStepError(RuntimeError):
    """A library asked a CPU stand-in for something it does not cover, or its helpers are not the ones the step
    was written for."""


def _cuda_default(device) -> bool:
    return device in ("cuda", -1) or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None)


def stand_ins(module: str) -> dict[str, Callable]:
    """The two stand-ins, their refusals naming `module`."""
    def refuse(call: str) -> CudaRngStepError:
        return CudaRngStepError(f"{module}.{call} on CPU: te_verify's CPU RNG step covers only the default device, "
                                f"clone=False and graph_safe=False (no graph-safe RNG tracker)")

    def get_state(device="cuda", clone: bool = False, graph_safe: bool = True) -> torch.Tensor:
        if not _cuda_default(device) or clone or graph_safe:
            raise refuse(f"_get_cuda_rng_state(device={device!r}, clone={clone}, graph_safe={graph_safe})")
        return torch.get_rng_state()

    def set_state(new_state: torch.Tensor, device=-1, graph_safe: bool = True) -> None:
        if not _cuda_default(device) or graph_safe:
            raise refuse(f"_set_cuda_rng_state(device={device!r}, graph_safe={graph_safe})")
        torch.set_rng_state(new_state)

    return {"_get_cuda_rng_state": get_state, "_set_cuda_rng_state": set_state}


def install(module_name: str, written_for: str) -> bool:
    """Install the stand-ins in `module_name` (idempotent: False when already there); raises where CUDA is present
    (the real helpers serve it) or the module's helpers are not what the step replaces (`written_for`: the release
    it was measured on, for the message)."""
    if torch.cuda.is_available():
        raise CudaRngStepError(f"the CPU RNG step for {module_name} is for the CPU run only: CUDA is available")
    module = importlib.import_module(module_name)
    if getattr(module._get_cuda_rng_state, "__te_verify_step__", False):
        return False
    for name, params in SIGNATURES.items():
        found = tuple(inspect.signature(getattr(module, name)).parameters)
        if found != params:
            raise CudaRngStepError(f"{module_name}.{name}{found} is not the {params} the CPU RNG step replaces "
                                   f"(written for {written_for}); its checkpoint cannot run on CPU with it")
    for name, stand_in in stand_ins(module_name).items():
        stand_in.__te_verify_step__ = True
        setattr(module, name, stand_in)
    return True
