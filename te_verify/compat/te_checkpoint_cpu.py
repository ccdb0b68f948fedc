"""TE's activation checkpoint (`transformer_engine.pytorch.distributed.checkpoint`) on a CPU-only torch.

TE's checkpoint saves and restores the CUDA RNG state around every forward and recompute through two module-level
helpers, `_get_cuda_rng_state` and `_set_cuda_rng_state` (its reentrant Function's forward and backward, and
`_CheckpointFrame.cache_rng_states` / `restore_rng_states` of the non-reentrant path), unconditionally; on a torch
built without CUDA the first call raises "Torch not compiled with CUDA enabled" before any TE module runs. On the
CPU run the random state the ops of a block draw from is the CPU generator's, which TE's checkpoint already saves
and restores beside the CUDA one (`torch.get_rng_state()`), so the step answers the CUDA helpers with the CPU
state: the call TE makes (no device, no clone, graph_safe False: no RNG-states tracker) and nothing else. A call
the step does not cover (a device index, clone=True, graph-safe states from a tracker) raises naming itself.

Applied only for the CPU run (the emulated --te-impl, no CUDA), once per process; guarded by the two helpers'
signatures in the installed TE (measured on 2.20.2: compat.versions), recorded for the report header.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect

import torch

from te_verify.compat import record

MODULE = "transformer_engine.pytorch.distributed"
# The helpers' parameters as TE 2.20.2 declares them: what the stand-ins replace must still be this.
SIGNATURES = {"_get_cuda_rng_state": ("device", "clone", "graph_safe"),
              "_set_cuda_rng_state": ("new_state", "device", "graph_safe")}
STEP = ("te-checkpoint-cpu-rng: TE's distributed.checkpoint saves the CUDA RNG state around each forward and "
        "recompute; on the CPU run its _get_cuda_rng_state/_set_cuda_rng_state read and set the CPU generator's "
        "(only the no-device, no-clone, non-graph-safe call; anything else raises)")


class TECheckpointStepError(RuntimeError):
    """TE asked the CPU stand-in for something it does not cover, or the installed TE is not what it was written for."""


def _cuda_default(device) -> bool:
    return device in ("cuda", -1) or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None)


def _refuse(call: str) -> TECheckpointStepError:
    return TECheckpointStepError(f"{MODULE}.{call} on CPU: te_verify's CPU RNG step covers only the default device, "
                                 f"clone=False and graph_safe=False (no get_rng_state_tracker)")


def _get_cpu_rng_state(device="cuda", clone: bool = False, graph_safe: bool = True) -> torch.Tensor:
    if not _cuda_default(device) or clone or graph_safe:
        raise _refuse(f"_get_cuda_rng_state(device={device!r}, clone={clone}, graph_safe={graph_safe})")
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device=-1, graph_safe: bool = True) -> None:
    if not _cuda_default(device) or graph_safe:
        raise _refuse(f"_set_cuda_rng_state(device={device!r}, graph_safe={graph_safe})")
    torch.set_rng_state(new_state)


def apply() -> None:
    """Install the CPU stand-ins in TE's distributed module (idempotent); raises where CUDA is present (the real
    helpers serve it) or TE's helpers are not the ones the step was written for."""
    if torch.cuda.is_available():
        raise TECheckpointStepError("the CPU RNG step is for the CPU run only: CUDA is available, TE's own helpers serve it")
    module = importlib.import_module(MODULE)
    if getattr(module._get_cuda_rng_state, "__te_verify_step__", False):
        return
    version = importlib.metadata.version("transformer-engine")
    for name, params in SIGNATURES.items():
        found = tuple(inspect.signature(getattr(module, name)).parameters)
        if found != params:
            raise TECheckpointStepError(f"TE {version}: {MODULE}.{name}{found} is not the {params} the CPU RNG step "
                                        f"replaces (written for TE 2.20.2); TE's checkpoint cannot run on CPU with it")
    for name, stand_in in (("_get_cuda_rng_state", _get_cpu_rng_state), ("_set_cuda_rng_state", _set_cpu_rng_state)):
        stand_in.__te_verify_step__ = True
        setattr(module, name, stand_in)
    record(STEP)
