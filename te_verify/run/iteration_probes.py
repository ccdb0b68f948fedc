"""The waste probes of every iteration after the first: a fresh probe of each kind the first iteration ran under
(each that can make one: `again()`), around a later iteration's forward and backward passes, its figures and
observations kept in Record.later for the waste checks (checks.iterations). They join the run's one dispatch watcher
(dispatch.session), told first that a new iteration starts (its layers' inputs are learnt anew)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from te_verify.probes import dispatch
from te_verify.probes.base import Probe
from te_verify.record import Record


def bind_probes(probes: list[Probe], model: torch.nn.Module) -> list[Probe]:
    """Probes that attribute work to layers learn the model's parameters (`bind`); returns `probes`."""
    for probe in probes:
        getattr(probe, "bind", lambda m: None)(model)
    return probes


class IterationProbes:
    """Makes, enters and reads the probes of each later iteration; nothing where the run is unprobed."""

    def __init__(self, probes: list[Probe], model: torch.nn.Module, record: Record) -> None:
        self.kinds = [p for p in probes if hasattr(p, "again")]
        self.model, self.record = model, record

    @contextlib.contextmanager
    def around(self, iteration: int) -> Iterator[list[Probe]]:
        """Inside: iteration `iteration`'s forward and backward passes under fresh probes (yielded, to hear the
        phases); on a normal exit their figures and observations go to record.later[iteration]."""
        if not self.kinds:
            yield []
            return
        dispatch.new_iteration()
        probes = bind_probes([p.again() for p in self.kinds], self.model)
        with contextlib.ExitStack() as stack:
            for probe in probes:
                stack.enter_context(probe)
            yield probes
        figures, observations = {}, {}
        for probe in probes:
            figures.update(probe.figures())
            observations.update(probe.observations())
        self.record.later[iteration] = (figures, observations)
