"""A rank's later steps and the probes every probed iteration runs under: a wrapper's steps after the measured one
(the retention check's, counted as iterations 2-4), each under the collective counter and fresh waste probes
(run.iteration_probes: RankOutcome.later), so frozen_collectives and the rank's waste checks judge every iteration
(issue 36, item 1); an engine's whole unobserved iterations."""
from __future__ import annotations

from typing import Callable

from torch import nn

from te_verify.distributed.rank.accumulate import accumulate
from te_verify.distributed.rank.observe import CollectiveCounter
from te_verify.distributed.rank.training import microbatches
from te_verify.distributed.types import Wrapped
from te_verify.models import CaseInputs
from te_verify.oracle.sites import linear_weights
from te_verify.probes import dispatch
from te_verify.probes.flops import GemmProbe
from te_verify.probes.memory import PeakMemoryProbe
from te_verify.probes.saved import SavedTensorsProbe
from te_verify.run.iteration_probes import IterationProbes
from te_verify.run.runner import set_phase
from te_verify.spec import CaseSpec
from te_verify.training import chunked, run_iteration

def engine_iteration(spec: CaseSpec, wrapped: Wrapped, inputs: CaseInputs) -> None:
    """One whole unobserved iteration (the retention check's later steps)."""
    run_iteration(wrapped.module, wrapped.train, chunked(inputs.x, inputs.grad_output, microbatches(spec)),
                  lambda phase, microbatch: None)
    wrapped.train.step()


def later_step(spec: CaseSpec, wrapped: Wrapped, counter: CollectiveCounter,
                later: IterationProbes) -> Callable[[CaseInputs], None]:
    """The retention check's later steps: an engine's whole iterations (unobserved); a wrapper's forward and backward,
    each under the collective counter and `later`'s probes as the next iteration (2, 3, 4: frozen_collectives and the
    rank's waste checks judge every iteration; an accumulating one's microbatches as in the measured iteration), but
    under a freeze schedule, whose iterations distributed.schedule runs, counts and probes."""
    if wrapped.train is not None:
        return lambda inputs: engine_iteration(spec, wrapped, inputs)

    def step(inputs: CaseInputs) -> None:
        if spec.schedule:
            wrapped.module(inputs.x).backward(inputs.grad_output)
            return
        counter.iteration += 1
        with counter.patched(), later.around(counter.iteration + 1) as probes:
            if spec.microbatches > 1:  # accumulating as in the measured iteration: its probes watch microbatch 1
                accumulate(spec, wrapped, inputs.x, inputs.grad_output,
                           lambda name, k: set_phases(counter, probes, name, k), None, False)
            else:
                set_phases(counter, probes, "forward")
                out = wrapped.module(inputs.x)
                set_phases(counter, probes, "backward")
                out.backward(inputs.grad_output)
            counter.phase = "step"
            set_phase(probes, "idle")
        dispatch.set_phase("second step")  # the retention's measure goes on tracking the rest of the step
    return step


def set_phases(counter: CollectiveCounter, probes: list, phase: str, microbatch: int = 0) -> None:
    """The collective counter's phase, and the probes' (backward is pass 1; an engine's finish is the probes' idle).
    The probes watch the first microbatch only: the oracle of a rank is its first microbatch's (verify.local_spec)."""
    counter.phase, counter.microbatch = phase, microbatch
    if microbatch > 0:
        set_phase(probes, "idle")
    elif phase == "forward":
        set_phase(probes, "forward")
    elif phase == "backward":
        set_phase(probes, "backward", 1)
    else:
        set_phase(probes, "idle")


def rank_probes(wrapped: Wrapped, spec: CaseSpec) -> list:
    """The waste probes of the single-process lanes, bound to the wrapped layers (their weights name the layers;
    a sharded wrapper's unsharded copies are matched to them, see probes.dispatch). A model family's probe binds
    every linear of the unwrapped model in module order (the oracle's sites) and follows copies, as the torch
    lane's family runs do."""
    if spec.model is None:
        gemms = GemmProbe()
        gemms.bind(nn.Sequential(*wrapped.layers), [(spec.widths[k + 1], spec.widths[k]) for k in range(spec.n_layers)])
    else:
        gemms = GemmProbe(follow_copies=True)
        gemms.bind(wrapped.model, [site.shape for site in linear_weights(wrapped.model)])
    return [gemms, SavedTensorsProbe(), PeakMemoryProbe()]
