"""How a torchrun job ends when it must: a report folder in use by another live run, and a case past its timeout.

The report folder is locked by rank 0 (te_verify.report.lock, as the plugin locks it) before anything is written;
a refusal is broadcast, so every rank exits 2 with rank 0's one line. A case that hangs holds every rank in a
collective, so no rank can go on to the next case: each rank's watchdog (te_verify.case_timeout's, the one the
single-process lanes use) fires at `--case-timeout` seconds; rank 0 writes the case's row ("timed out after N s"
with its stacks) and the report marked incomplete (the cases that never ran, and why) and exits 1; the other ranks
print their stacks and wait for torchrun to stop them, so torchrun ends the job and reports it. `--resume` is not offered
under torchrun: rerun the job with --family to take up the rest.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO

import torch.distributed as dist

from te_verify.case_timeout import Watchdog
from te_verify.report.lock import ReportLock, ReportLockError, acquire
from te_verify.report.stream import RowStream, incomplete_line, partial_results

TIMEOUT_EXIT = 1  # the job failed: a case timed out
# A rank other than 0 leaves the ending to rank 0 (whose exit makes torchrun stop the others) and exits by itself only
# if that has not happened this long after its own timeout (rank 0 dead or stuck holding the interpreter lock).
PEER_GRACE_S = 20.0


def claim_report_dir(report_dir: str | None, rank: int, run_id: str) -> ReportLock | None:
    """Rank 0 locks the report folder; every rank raises ReportLockError with rank 0's line when it is in use."""
    lock, refusal = None, [None]
    if rank == 0 and report_dir:
        try:
            lock = acquire(Path(report_dir), run_id)
        except ReportLockError as exc:
            refusal[0] = str(exc)
    dist.broadcast_object_list(refusal, src=0)
    if refusal[0] is not None:
        raise ReportLockError(refusal[0])
    return lock


class CaseTimeout:
    """This rank's watchdog over the case running; on rank 0 it ends the job with the case's row and the report."""

    def __init__(self, rank: int, report_dir: str | None, stream: RowStream | None, timed_out_row) -> None:
        self.rank = rank  # this process's global rank
        self.report_dir = report_dir  # where rank 0 writes the report (None: nowhere)
        self.stream = stream  # rank 0's row stream (None on the other ranks, or without --report-dir)
        self.timed_out_row = timed_out_row  # (spec, seconds, message) -> the case's row
        self._stderr: IO[str] = os.fdopen(os.dup(2), "w")
        self._watchdog = Watchdog(self._end, self._stderr)

    def arm(self, spec, seconds: float | None) -> None:
        if seconds:
            self._watchdog.arm(spec, seconds)

    def disarm(self) -> None:
        self._watchdog.disarm()

    def _end(self, spec, seconds: float, message: str) -> None:
        self._stderr.write(f"\nte_verify.distributed: rank {self.rank}: {spec.id}: {message}\n")
        if self.rank != 0:
            self._stderr.flush()
            time.sleep(PEER_GRACE_S)
            os._exit(TIMEOUT_EXIT)
        ending = "the job ends here (a hung case holds every rank)"
        if self.stream is not None and self.report_dir:
            self.stream.write("row", self.timed_out_row(spec, seconds, f"rank 0: {message}"))
            self.stream.write("ended", {"why": f"the job ended at {spec.id}'s timeout ({seconds:g} s)"})
            from te_verify.report.writer import write_report

            results = partial_results(Path(self.report_dir))
            write_report(Path(self.report_dir), results)
            ending += f"; report in {self.report_dir}, {incomplete_line(results['header']) or 'complete'}"
        self._stderr.write(f"te_verify.distributed: {ending}\n")
        self._stderr.flush()
        sys.stdout.flush()
        os._exit(TIMEOUT_EXIT)
