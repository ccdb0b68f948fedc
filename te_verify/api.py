"""te_verify's stable surface: everything user code imports, from one module (docs/api.md).

Users' backends, TE builds, wrappers and engines live outside this repository, so what they import must not move
when te_verify's packages do: `from te_verify.api import ...` is the one import they write. A name here keeps its
meaning for at least one release after any change, which then keeps the old spelling with a DeprecationWarning
(te_verify.moved). Anything else under te_verify is internal and may move without notice.

Why a module at the top of the package, not the package itself (`from te_verify import ...`): te_verify/__init__.py
runs for every internal import (the pytest plugin, each rank of the pool), so it stays empty; this module is imported
only by code that wants the surface. It is light: torch and te_verify's base types; no TE boot, no thunder, no
wrapper or engine package (tests/test_public_api.py). It sits at the top of the layering (tests/test_layout.py):
nothing in te_verify imports it.
"""
from __future__ import annotations

from te_verify.backends.base import Backend
from te_verify.distributed.types import (Slot, Wrapped, grad_of, param_slots, param_tensors, storage_bytes, units_of,
                                         value_of)
from te_verify.spec import CaseSpec, DistConfig, ModelConfig, SpecError, TEConfig
# The TE build API, renamed: beside the other names here, REQUIRED, resolve and active would not say they are TE's.
from te_verify.te.api import LINEAR_KEYWORDS as TE_LINEAR_KEYWORDS, REQUIRED as TE_REQUIRED_NAMES, TEImpl, TEImplError
from te_verify.te.api import active as active_te_impl, resolve as resolve_te_impl
from te_verify.training import StateBytes, TrainStep, optimizer_for, optimizer_step, sgd

__all__ = [
    # Your own backend (`--backend package.module:attr`).
    "Backend",  # the protocol: name, available() -> (bool, reason), prepare(model, spec) -> callable
    # Your own wrapper (a declaration with name, wrap(model, spec) -> Wrapped, shards).
    "Wrapped",  # what wrap returns: the callable, its units, full gradients and parameters, gathered bytes
    "Slot",  # a parameter's place before wrapping: (qualified name, owning module, attribute)
    "param_slots",  # every parameter's Slot, taken before wrapping
    "param_tensors",  # a function of every slotted parameter (its gradient, its value), cloned, by name
    "grad_of",  # param_tensors' reader of gradients
    "value_of",  # param_tensors' reader of values
    "units_of",  # what a wrapper wraps one by one: a stack's layers, a family's blocks
    "storage_bytes",  # bytes of a tensor's storage: a sharding wrapper's gathered bytes per unit
    # Your own training engine (a wrapper whose Wrapped has train=TrainStep(...)).
    "TrainStep",  # backward, finish, step, no_sync, state, forward: how the engine trains
    "StateBytes",  # what TrainStep.state reports per category: bytes on this rank, sharded or not
    "sgd",  # the optimizer eager's trajectory uses (SGD, lr 0.1, momentum 0.9): an engine's parameters follow it
    "optimizer_for",  # sgd over the parameters that train now (None where none does)
    "optimizer_step",  # one step of it (main_grad where a parameter keeps one), gradients cleared
    # What a case is.
    "CaseSpec",  # the case every prepare and wrap receives
    "TEConfig",  # its TE part (module, recipe, options)
    "DistConfig",  # its distributed part (wrapper, world size, options)
    "ModelConfig",  # its model-family part (kind, blocks, LoRA, frozen stages)
    "SpecError",  # raised for a spec that cannot exist, naming the field
    # Your own TE build (`--te-impl package.module`).
    "TE_REQUIRED_NAMES",  # names a --te-impl module must expose (besides autocast or fp8_autocast)
    "TE_LINEAR_KEYWORDS",  # keywords its Linear must take (TE's bias, params_dtype, device)
    "TEImpl",  # a resolved implementation: name, kind, describe, and `.api` (its namespace, loaded on first use)
    "TEImplError",  # an unknown or unusable --te-impl, in one line
    "resolve_te_impl",  # the TEImpl of a --te-impl value (None: this machine's default); a build patching TE's own
    #                     Python resolves "transformer_engine_cpu" (or "transformer_engine") and reads its `.api`
    "active_te_impl",  # the TEImpl the TE backends use in this process
]
