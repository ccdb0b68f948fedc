"""A backend that kills its own process on one case (as a segfault or an OOM kill would): the run must report that
case as crashed and keep every other verdict (tests/test_streaming.py). Only under xdist, which replaces the worker.
Beside it, the faults of tests/test_reliability.py: a backend killing every worker, one hanging in a forward, one
holding its run open."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

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


class KillsEveryWorker(KillsItsWorker):
    """Kills its worker on every case: more crashes than xdist has restarts."""

    name = "planted_kills_every_worker"

    def prepare(self, model, spec):
        os.kill(os.getpid(), signal.SIGKILL)


def hang_in_forward(x):
    """A forward that never returns (a deadlock, a collective no peer joins); when it began goes to the file named by
    $TE_VERIFY_TEST_HANG_STARTED, if set."""
    if os.environ.get("TE_VERIFY_TEST_HANG_STARTED"):
        Path(os.environ["TE_VERIFY_TEST_HANG_STARTED"]).write_text(str(time.time()))
    threading.Event().wait()


class HangsInForward(KillsItsWorker):
    """Hangs in the forward of VICTIM; every other case runs as eager."""

    name = "planted_hangs"

    def prepare(self, model, spec):
        return hang_in_forward if spec.id == VICTIM else model


class WaitsForFlag(KillsItsWorker):
    """Holds its run open until the file named by $TE_VERIFY_TEST_FLAG exists (at most a minute): a live run whose
    report folder another run tries to take."""

    name = "planted_waits"

    def prepare(self, model, spec):
        flag, deadline = Path(os.environ["TE_VERIFY_TEST_FLAG"]), time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return model
