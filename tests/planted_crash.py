"""A backend that kills its own process on one case (as a segfault or an OOM kill would): the run must report that
case as crashed and keep every other verdict (tests/test_streaming.py). Only under xdist, which replaces the worker."""
from __future__ import annotations

import os
import signal

from te_verify.matrix.stacks import FAMILIES

VICTIM = FAMILIES["freeze"]("smoke")[1].id  # the case whose worker dies


class KillsItsWorker:
    name = "planted_kills_worker"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model, spec):
        if spec.id == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        return model
