"""A per-case timeout in every lane (`--case-timeout SECONDS`): a case past it fails "timed out after N s" with the
stack of every thread where it hung, and the run goes on.

Defaults (DEFAULT_S) are per tier and lane, several times the slowest case measured: a thunder model-family case
takes up to ~15 s on 2 loaded cores (compile included), an inductor one about as long; a distributed case has the
rank pool's own timeouts (--dist-timeout per case, 3 per block for thunder on a model family, 120 s to start a pool)
inside this one, which only ends what they cannot (the caller itself stuck). A test that draws its own specs
(cases/test_generated.py) gets the timeout once per example. `--case-timeout 0` turns it off; tests outside cases/
get one only when it is given.

How a case is ended, since a thread stuck in a case cannot be stopped safely from inside its process:
- under xdist, the worker writes the message to `<run folder>/<worker id>.timeout` (te_verify.tmpdirs) and exits
  with TIMED_OUT_EXIT; xdist starts a new worker, and the controller's row of the case reads the message
  (te_verify.run_report.pytest_handlecrashitem): outcome "failed", reason "timed out after N s" and the stacks;
- without xdist (-n 0) nothing can replace the process: the case's row is written, the report is written marked
  incomplete (the cases that never ran, and why), and the process exits with END_EXIT; `--resume DIR` runs the rest.
A case stuck in C code that never releases the interpreter lock stops this thread too: faulthandler's own timer
ends the process BACKSTOP_S later, dumping the stacks the same way (under xdist into the same file).
"""
from __future__ import annotations

import faulthandler
import functools
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable

import pytest

from te_verify import tmpdirs

# Seconds a case may take, per tier and lane, unless --case-timeout says otherwise.
DEFAULT_S: dict[str, dict[str, float]] = {
    "smoke": {"torch": 120.0, "te": 120.0, "dist": 600.0},
    "pr": {"torch": 180.0, "te": 180.0, "dist": 600.0},
    "nightly": {"torch": 300.0, "te": 300.0, "dist": 900.0},
}
DIST_FACTOR = 10  # a distributed case's default: at least this many --dist-timeouts
BACKSTOP_S = 30.0  # after the timeout, faulthandler ends a process whose case holds the interpreter lock
TIMED_OUT_EXIT = 124  # a worker that ended itself at a case's timeout (as timeout(1) exits)
END_EXIT = int(pytest.ExitCode.INTERRUPTED)  # -n 0: the run ended at a case's timeout, cases left unrun
STACK_FRAMES = 40  # most recent frames shown per thread
# Frames of the harness, left out of the stacks shown: they are the same for every case.
HARNESS = ("/_pytest/", "/pluggy/", "/xdist/", "/execnet/", "/pytest/__main__.py", "runpy")
DIR_KEY = "te_verify_timeouts"  # workerinput: the folder where workers leave their timeout messages
_RUN_DIR = pytest.StashKey[str]()  # the controller's folder of timeout messages
# Without xdist: what writes the timed-out case's row and the incomplete report and says where (te_verify.run_report,
# which holds the run's rows, sets it: it imports this module, not this module it).
END_RUN = pytest.StashKey[Callable[[pytest.Item, float, str], str]]()
_WATCHDOG = pytest.StashKey["Watchdog"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("te_verify").addoption(
        "--case-timeout", type=float, default=None, metavar="SECONDS",
        help="seconds a case may run before it fails 'timed out' with its stack and its worker is replaced (default "
             "per tier and lane: " + "; ".join(f"{t} " + ", ".join(f"{lane} {s:g}" for lane, s in d.items())
                                               for t, d in DEFAULT_S.items()) + "; 0: none)")


def case_timeout(item: pytest.Item) -> float | None:
    """The seconds `item` may run, or None for no limit."""
    config = item.config
    given = config.getoption("case_timeout")
    lane = getattr(getattr(item, "module", None), "LANE", None)
    if given is None and lane is None:
        return None  # not a case (the project's own tests): only an explicit --case-timeout limits it
    seconds = given if given is not None else DEFAULT_S.get(config.getoption("tier"), DEFAULT_S["pr"]).get(lane)
    if given is None and lane == "dist":  # room for the pool's start and a thunder case's longer pool timeout
        seconds = max(seconds, DIST_FACTOR * config.getoption("dist_timeout"))
    if seconds and "lane_backend" in getattr(item, "fixturenames", ()):
        seconds *= max(1, config.getoption("max_examples"))  # one test, many drawn cases
    return seconds or None


def timed_out_message(seconds: float, case_thread: int | None) -> str:
    """"timed out after N s" and the stack of every thread but this one, the case's first."""
    frames = sys._current_frames()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    idents = sorted((i for i in frames if i != threading.get_ident()), key=lambda i: i != case_thread)
    lines = [f"timed out after {seconds:g} s; the stack of every thread (most recent call last; pytest's frames left "
             f"out):"]
    for ident in idents:
        lines.append(f"thread {names.get(ident, ident)}{' (running the case)' if ident == case_thread else ''}:")
        lines.append("".join(_stack(frames[ident]).format()).rstrip())
    return "\n".join(lines)


def _stack(frame) -> traceback.StackSummary:
    """A thread's stack without the harness's frames (all of it where it is only harness), the most recent
    STACK_FRAMES frames."""
    entries = traceback.extract_stack(frame)
    own = [e for e in entries if not any(part in e.filename for part in HARNESS)] or entries
    return traceback.StackSummary.from_list(own[-STACK_FRAMES:])


class Watchdog:
    """One thread per process that runs cases: calls `on_timeout(item, seconds, message)` when the armed case runs
    past its deadline (on_timeout ends the process). The item is a pytest item, or a torchrun job's case spec."""

    def __init__(self, on_timeout: Callable[[Any, float, str], None], backstop_file: IO[str]) -> None:
        self._on_timeout = on_timeout
        self._backstop_file = backstop_file  # where faulthandler's backstop dumps
        self._cond = threading.Condition()
        self._case: tuple[Any, float, float, int] | None = None  # item, seconds, deadline, its thread
        threading.Thread(target=self._watch, name="te_verify-case-timeout", daemon=True).start()

    def arm(self, item: Any, seconds: float) -> None:
        faulthandler.dump_traceback_later(seconds + BACKSTOP_S, exit=True, file=self._backstop_file)
        with self._cond:
            self._case = (item, seconds, time.monotonic() + seconds, threading.get_ident())
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._case = None
            self._cond.notify()
        faulthandler.cancel_dump_traceback_later()

    def _watch(self) -> None:
        with self._cond:
            while True:
                case = self._case
                remaining = case[2] - time.monotonic() if case is not None else None
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
        item, seconds, _, thread = case
        self._on_timeout(item, seconds, timed_out_message(seconds, thread))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    seconds = case_timeout(item)
    if seconds is None:
        return (yield)
    watchdog = _watchdog(item.config)
    watchdog.arm(item, seconds)
    try:
        return (yield)
    finally:
        watchdog.disarm()


def _watchdog(config: pytest.Config) -> Watchdog:
    """This process's watchdog, made at its first case: an xdist worker's or the only process's."""
    if _WATCHDOG not in config.stash:
        worker = getattr(config, "workerinput", None)
        if worker is not None and worker.get(DIR_KEY):
            report = open(Path(worker[DIR_KEY]) / f"{worker['workerid']}.timeout", "w", encoding="utf-8")
            config.stash[_WATCHDOG] = Watchdog(functools.partial(_end_worker, report), report)
        else:
            stderr = os.fdopen(os.dup(2), "w")  # the terminal's, not pytest's capture of the case
            config.stash[_WATCHDOG] = Watchdog(functools.partial(_end_run, config.stash.get(END_RUN, None), stderr),
                                               stderr)
    return config.stash[_WATCHDOG]


def _end_worker(report: IO[str], item: pytest.Item, seconds: float, message: str) -> None:
    """xdist worker: leave the message for the controller and exit; xdist starts a new worker."""
    report.seek(0)
    report.truncate()
    report.write(message)
    report.flush()
    os._exit(TIMED_OUT_EXIT)


def _end_run(end_run: Callable | None, stderr: IO[str], item: pytest.Item, seconds: float, message: str) -> None:
    """-n 0: END_RUN writes the case's row and the report marked incomplete; the message and where the report is go
    to the terminal; exit."""
    ending = end_run(item, seconds, message) if end_run is not None else "the run ends here"
    stderr.write(f"\n{item.nodeid}: {message}\n\nte_verify: {ending}\n")
    stderr.flush()
    os._exit(END_EXIT)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """The controller gives every xdist worker the folder where a worker that times out leaves its message."""
    config = node.config
    if _RUN_DIR not in config.stash:
        config.stash[_RUN_DIR] = tmpdirs.make("te_verify_timeouts")
    node.workerinput[DIR_KEY] = config.stash[_RUN_DIR]


def timed_out(config: pytest.Config, worker_id: str) -> str | None:
    """The controller: the message a dead worker left if it ended itself at a case's timeout, else None."""
    if _RUN_DIR not in config.stash:
        return None
    try:
        text = (Path(config.stash[_RUN_DIR]) / f"{worker_id}.timeout").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not text.strip() or text.startswith("timed out after"):
        return text.strip() or None
    backstop = re.match(r"Timeout \((\d+):(\d+):(\d+)", text)  # faulthandler's dump: the case held the interpreter
    after = f"{int(backstop[1]) * 3600 + int(backstop[2]) * 60 + int(backstop[3])} s" if backstop else "its limit"
    return f"timed out after {after} (the case never released the interpreter lock; faulthandler's dump):\n{text}"


def pytest_unconfigure(config: pytest.Config) -> None:
    tmpdirs.remove(config.stash.get(_RUN_DIR, None))
