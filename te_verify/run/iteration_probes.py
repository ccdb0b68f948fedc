"""The waste probes of every iteration after the first: a fresh probe of each kind the first iteration ran under
(each that can make one: `again()`), around a later iteration's forward and backward passes, its figures and
observations kept by iteration (Record.later, a rank's RankOutcome.later) for the waste checks (checks.iterations).
They join the run's one dispatch watcher (dispatch.session), told first that a new iteration starts (its layers'
inputs are learnt anew)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

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
    """Makes, enters and reads the probes of each later iteration; nothing where the run is unprobed. `make` makes
    one iteration's bound probes (None: unprobed); `later` receives (figures, observations) by iteration."""

    def __init__(self, make: Callable[[], list[Probe]] | None, later: dict) -> None:
        self.make, self.later = make, later

    @classmethod
    def like(cls, probes: list[Probe], model: torch.nn.Module, record: Record) -> "IterationProbes":
        """Fresh probes of the kinds in `probes` (those with `again()`), bound to `model`, into record.later."""
        kinds = [p for p in probes if hasattr(p, "again")]
        make = (lambda: bind_probes([p.again() for p in kinds], model)) if kinds else None
        return cls(make, record.later)

    @contextlib.contextmanager
    def around(self, iteration: int) -> Iterator[list[Probe]]:
        """Inside: iteration `iteration`'s forward and backward passes under fresh probes (yielded, to hear the
        phases); on a normal exit their figures and observations go to later[iteration]."""
        if self.make is None:
            yield []
            return
        dispatch.new_iteration()
        probes = self.make()
        with contextlib.ExitStack() as stack:
            for probe in probes:
                stack.enter_context(probe)
            yield probes
        figures, observations = {}, {}
        for probe in probes:
            figures.update(probe.figures())
            observations.update(probe.observations())
        self.later[iteration] = (figures, observations)
