"""What the distributed lane's training engines (Megatron-core DDP, Megatron-FSDP, DeepSpeed ZeRO) add to the shared
training step (te_verify.training): the state bytes an engine keeps, its microbatches, the eager SGD trajectory its
parameters are judged against, and TE's Linear for the engines that wrap it.

An engine's case runs spec.iterations iterations of te_verify.training.run_iteration (forward and backward of every
microbatch, its no-sync context on all but the last, the engine's finish: phase "backward_end"), the gradients read
(the first iteration's are compared with eager's), the engine's optimizer step (phase "step"), the parameters read
(compared with eager SGD's after the same number of steps: the engine's optimizer is under test, so an engine
follows its own trajectory). Collectives of every iteration are recorded: ZeRO-3 traces its first iteration and
Megatron's overlap dispatches from its second, so waste of either kind shows in one of them.
"""
from __future__ import annotations

import torch
from torch import nn

from te_verify import training
from te_verify.models import apply_schedule, frozen_at_backward, make_inputs
from te_verify.spec import CaseSpec


def microbatches(spec: CaseSpec) -> int:
    """A rank's microbatches per iteration: a wrapper's CaseSpec.microbatches, an engine's dist option."""
    if spec.microbatches > 1:
        return spec.microbatches
    return int(dict(spec.dist.options).get("microbatches", 1)) if spec.dist is not None else 1


def eager_trajectory(spec: CaseSpec, dtype: torch.dtype | None = None, start: torch.dtype | None = None,
                     autocast: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """Single-process eager SGD on the global batch (training.eager_trajectory): every parameter after each of the
    spec's iterations; in `dtype` (float64: the truth the engines' trajectories are bounded by); from the parameters
    rounded to `start` (an engine that casts them in place: Engine.casts_params_to); forwards under `autocast`."""
    inputs = make_inputs(spec)
    model, x, cotangent = frozen_at_backward(spec), inputs.x, inputs.grad_output
    if start is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(start))
    if dtype is not None:  # token ids (LitGPT, transformers) stay integers: an embedding takes no float64 index
        model, cotangent = model.to(dtype), cotangent.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x
    if x.is_floating_point():  # as the ranks' batch: a reentrant checkpoint records no graph unless an input needs grad
        x = x.detach().requires_grad_(spec.input_requires_grad)
    return training.eager_trajectory(model, x, cotangent, spec.iterations, lambda k: apply_schedule(model, spec, k),
                                     autocast)


def load_te() -> None:
    """Megatron's packages import transformer_engine wherever it is installed: TE's Python over the active --te-impl
    (on a CPU rank, the tex emulation) is loaded first, as the TE lane loads it."""
    from te_verify.te import api as te_api

    te_api.active().api


def te_stack(model: nn.Sequential, spec: CaseSpec) -> nn.Sequential:
    """The stack's layers as TE Linear modules of the active --te-impl holding the same Parameters (the TE lane's
    converter), with fuse_wgrad_accumulation where spec.te asks for it: an engine wraps these. High precision only."""
    from te_verify.te import api as te_api
    from te_verify.backends.te_eager import convert

    if spec.te.module != "linear" or spec.te.recipe is not None:
        raise ValueError(f"te={spec.te.tag}: the engines run TE's Linear in high precision only")
    return nn.Sequential(*convert(model, spec, te_api.active().api))
