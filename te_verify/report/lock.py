"""One live run per report folder: `<dir>/.te_verify.lock` holds the run's pid, host and run id under an flock.

Two runs writing one folder would interleave rows.jsonl and the later one's results.json would replace the
earlier one's, losing verdicts silently; so the second is refused in one line naming the first. The kernel drops an
flock when its process dies, however it dies, so a killed run's lock is stale at once and the next run takes the
folder over. A lock still held although the pid it names is gone (an orphaned child of a killed run kept the file
open) is taken over as stale too.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from te_verify.tmpdirs import pid_alive

LOCK = ".te_verify.lock"


class ReportLockError(ValueError):
    """The folder is in use by a live run; one line naming that run."""


class ReportLock:
    """A held lock on a report folder; `release()` (or the process's end) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path  # the lock file
        self._fd: int | None = fd  # open and flocked while held

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a run that opened it meanwhile sees another file and retries
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None


def _holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _refusal(option: str, folder: Path, holder: dict) -> ReportLockError:
    run, pid, host, started = (holder.get(key, "?") for key in ("run_id", "pid", "host", "started"))
    return ReportLockError(f"{option} {folder} is in use by run {run} (pid {pid} on {host}, started {started}): wait "
                           "for it to end or choose another folder")


def acquire(folder: Path, run_id: str, option: str = "--report-dir") -> ReportLock:
    """Lock `folder` for the run `run_id` of this process; ReportLockError if a live run holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    for _ in range(5):  # another run may replace the file between our open and our lock: open it again
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            pid = holder.get("pid")
            if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid_alive(pid):
                raise _refusal(option, folder, holder) from None
            _unlink(path)  # held by what a dead run left running: stale
            continue
        if not _same_file(fd, path):
            os.close(fd)
            continue
        record = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        return ReportLock(path, fd)
    raise ReportLockError(f"{option} {folder}: could not lock {path} (other runs keep replacing it)")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
