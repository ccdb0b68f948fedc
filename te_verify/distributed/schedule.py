"""Freeze schedules in the distributed lane (CaseSpec.schedule). A wrapper without an optimizer (DDP, FSDP, ...)
takes no step, so after its measured iteration each later iteration k runs on the parameters as built: the change
applied to the layers the wrapper runs (by their slots, as freezing after wrapping is), forward and backward of the
rank's shard, the full gradients read, then cleared. The reference is single-process eager doing the same on the
global batch (`reference_iterations`); checks.dist_parity.dist_schedule_parity compares them per iteration, and
gradient_volume and frozen_collectives judge each iteration's collectives against the parameters trainable in it.
A training engine follows the schedule inside its own iterations (rank.case_runner, rank.training)."""
from __future__ import annotations

import torch

from te_verify.distributed.rank.observe import CollectiveCounter
from te_verify.distributed.types import Wrapped
from te_verify.models import CPU, apply_schedule, frozen_at_backward, make_inputs
from te_verify.run.iteration_probes import IterationProbes
from te_verify.run.runner import set_phase
from te_verify.spec import CaseSpec
from te_verify.training import autocast_forward


def scheduled_iterations(spec: CaseSpec, wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor,
                         counter: CollectiveCounter, later: IterationProbes
                         ) -> tuple[list[dict[str, torch.Tensor | None]], str | None]:
    """On a rank: iterations 2..spec.iterations of a wrapper under the schedule, their collectives recorded by
    `counter` as iterations 1.. (0-based, as an engine's) and their forward and backward under `later`'s waste probes
    (judged against what trains in each: checks.iterations.spec_at); each one's full gradients (host copies, read
    outside the counter), and what the wrapper raised (its type and first line) where it refused a change (then no
    later one)."""
    grads: list[dict[str, torch.Tensor | None]] = []
    for k in range(2, spec.iterations + 1):
        try:
            apply_schedule(wrapped.layers, spec, k)
            for layer in wrapped.layers:  # the measured and retention steps' gradients are not this iteration's
                layer.zero_grad(set_to_none=True)
            with counter.patched(), later.around(k) as probes:
                counter.iteration, counter.phase = k - 1, "forward"
                set_phase(probes, "forward")
                out = wrapped.module(x.detach())
                counter.phase = "backward"
                set_phase(probes, "backward", 1)
                out.backward(cotangent)
                counter.phase = "step"
                set_phase(probes, "idle")
            grads.append({n: None if g is None else g.cpu() for n, g in wrapped.full_grads().items()})
        except Exception as exc:  # a wrapper that refuses the change: the check names it and the iteration
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return grads, f"iteration {k}: {type(exc).__name__}: {first[:300]}"
    return grads, None


def reference_iterations(spec: CaseSpec, truth: bool = False) -> list[dict[str, torch.Tensor | None]]:
    """Single-process eager on the global batch, no optimizer step: iterations 2..spec.iterations' gradients under
    the schedule, by qualified name; each forward under the spec's autocast (a wrapper's mixed-precision policy:
    distributed.precision.reference_spec), or in fp64 without it where `truth`."""
    model, inputs = frozen_at_backward(spec, CPU), make_inputs(spec, device=CPU)
    x, cotangent = inputs.x.detach(), inputs.grad_output
    if truth:
        model, x, cotangent = model.double(), x.double(), cotangent.double()
    forward = model if truth else autocast_forward(model, spec.autocast)
    grads = []
    for k in range(2, spec.iterations + 1):
        apply_schedule(model, spec, k)
        model.zero_grad(set_to_none=True)
        forward(x).backward(cotangent)
        grads.append({n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()})
    return grads
