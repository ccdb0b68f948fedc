"""What one case could leave for the next, cut before every run builds its model (process_state.watched around each
run of the torch and TE lanes, distributed.rank.case_runner.run_dist_case on every rank), so a verdict is the case's
alone. The process settings a run can change (grad mode, default dtype, threads, ...) are kept by
te_verify.run.process_state, which restores them after the run and names what it left:

- dynamo's state: compiled code, guards, and automatic dynamic shapes (`torch._dynamo.reset()`; dynamo's profile of
  which sizes changed lives in memory, pgo.py's code state, and reset() clears it), and its counters (the
  `compilations` figure reads this run's graphs only);
- compile caches that reset() does not touch (they live on disk and outlive the process): inductor's FX-graph cache,
  the AOTAutograd cache, dynamo's saved profile (local and remote each). A cache hit loaded a backward compiled
  ahead of time with donated buffers, so `backward(retain_graph=True)` raised only where an earlier case (in this
  process or an earlier one) had compiled the same graph. Switched off one by one (torch's catch-all,
  torch.compiler.config.force_disable_caches, warns at every compile after a reset);
- TE's process-global FP8 state (autocast depth, recipe, the global amax and scale buffers modules register into),
  reset as TE's own tests do between tests (`FP8GlobalStateManager.reset()`);
- the global RNG: seeded from the case, so anything drawing from it (a library's init, dropout) draws the same
  numbers in any order (the models draw their values from their own seeded generators);
- torch.nn.functional as torch ships it: DeepSpeed's ZeRO-3 replaces `F.linear` for the whole process with its
  memory-efficient linear and leaves it so (it saves a frozen layer's input: a later megatron_ddp case read it as
  its own waste).
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
from torch._dynamo.utils import counters

from te_verify.spec import CaseSpec

# Where the TE implementations keep their process-global FP8 state (TE >= 2.9, TE before 2.9, te_verify.te.reference),
# each exposing TE's FP8GlobalStateManager.reset(). Only modules already imported are reset: isolation never loads TE.
FP8_STATE_MODULES = ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8",
                     "te_verify.te.reference.autocast")


# torch.nn.functional's functions as imported, before any library could replace one (this module loads with the lanes).
FUNCTIONAL = {name: fn for name, fn in vars(torch.nn.functional).items() if callable(fn) and not name.startswith("_")}


def torch_functional() -> None:
    for name, fn in FUNCTIONAL.items():
        if getattr(torch.nn.functional, name) is not fn:
            setattr(torch.nn.functional, name, fn)


def no_compile_caches() -> None:
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.fx_graph_remote_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._functorch.config.enable_remote_autograd_cache = False
    torch._dynamo.config.automatic_dynamic_local_pgo = False
    torch._dynamo.config.automatic_dynamic_remote_pgo = False


def reset_fp8_state() -> None:
    for name in FP8_STATE_MODULES:
        manager = getattr(sys.modules.get(name), "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()


# TE's FP8 autocast state by the name a message gives it: (attribute on TE >= 2.15's FP8GlobalState or the reference's
# STATE, on the FP8GlobalStateManager class itself in TE 2.14.0), its value outside any autocast region.
FP8_FIELDS = {"autocast depth": (("autocast_depth", "depth", "FP8_AUTOCAST_DEPTH"), 0),
              "FP8 enabled": (("fp8_enabled", "enabled", "FP8_ENABLED"), False),
              "calibrating": (("fp8_calibration", "FP8_CALIBRATION"), False),
              "recipe": (("fp8_recipe", "recipe", "FP8_RECIPE"), None),
              "amax reduction group": (("fp8_distributed_group", "FP8_DISTRIBUTED_GROUP"), None),
              "FP8 parameters": (("fp8_parameters", "FP8_PARAMETERS"), False),
              "high-precision init values": (("high_precision_init_val", "HIGH_PRECISION_INIT_VAL"), False),
              "graph capturing": (("fp8_graph_capturing", "FP8_GRAPH_CAPTURING"), False),
              "first FP8 module": (("is_first_fp8_module", "IS_FIRST_FP8_MODULE"), False)}
FP8_LABELS = {"transformer_engine.pytorch.quantization": "TE", "transformer_engine.pytorch.fp8": "TE",
              "te_verify.te.reference.autocast": "te_verify.te.reference"}


def _fp8_holders() -> dict[str, object]:
    """label -> the object holding that implementation's FP8 autocast state, for the implementations loaded."""
    holders = {}
    for name in FP8_STATE_MODULES:
        module = sys.modules.get(name)
        manager = getattr(module, "FP8GlobalStateManager", None)
        if manager is not None and FP8_LABELS[name] not in holders:
            # te_verify.te.reference's STATE; TE >= 2.15's quantization_state on the manager; in 2.14.0 the class itself
            state = getattr(module, "STATE", None)
            holders[FP8_LABELS[name]] = state or getattr(manager, "quantization_state", manager)
    return holders


def _fp8_attr(holder: object, part: str) -> str | None:
    # TE 2.14's manager holds FP8_GRAPH_CAPTURING beside a classmethod fp8_graph_capturing() (likewise
    # is_first_fp8_module): the state is the data attribute; writing over the method breaks every later forward.
    return next((a for a in FP8_FIELDS[part][0] if hasattr(holder, a) and not inspect.isroutine(getattr(holder, a))),
                None)


def fp8_autocast_state() -> dict:
    """TE's FP8 autocast state, by "<label> <part>", of every implementation loaded (process_state judges it)."""
    return {f"{label} {part}": getattr(holder, attr) for label, holder in _fp8_holders().items()
            for part in FP8_FIELDS if (attr := _fp8_attr(holder, part)) is not None}


def fp8_unset(key: str) -> Any:
    """A part's value before its implementation was loaded: outside any autocast region (keys are "<label> <part>")."""
    return FP8_FIELDS[key.split(" ", 1)[1]][1]


def set_fp8_autocast_state(before: dict) -> None:
    """Put back what fp8_autocast_state read (a part it did not read: its value outside any region)."""
    for label, holder in _fp8_holders().items():
        for part in FP8_FIELDS:
            attr = _fp8_attr(holder, part)
            if attr is not None:
                setattr(holder, attr, before.get(f"{label} {part}", FP8_FIELDS[part][1]))


def fresh_case(spec: CaseSpec) -> None:
    """Put the process in the state a case starts from, whatever ran before it."""
    no_compile_caches()
    torch._dynamo.reset()
    counters.clear()  # reset() keeps them
    reset_fp8_state()
    torch_functional()
    torch.manual_seed(spec.seed)
