"""A persistent pool of N ranks: started once, runs many cases, rebuilt after a hang or a crash.

Spawning a process group costs ~2.3 s here; the pool pays it once per process (per xdist worker). Rendezvous
goes through a `file://` store in a fresh temporary directory (never a port), named after this process
(te_verify.tmpdirs): a pool killed with its process leaves it behind only until the next pool or run starts. A
case that times out or whose rank dies fails with the rank number and its stack (hung: faulthandler dump; raised:
traceback; died: the signal); the pool is then killed (each rank leads its own process group), reaped and verified
gone, and the next case starts a fresh pool. On a GPU the ranks sit on distinct GPUs from the caller's on (nccl forbids two
ranks of one communicator on one GPU); a world larger than the GPUs seen is refused (`rank_devices`).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

from te_verify import device as run_device
from te_verify import tmpdirs
from te_verify.distributed.pool import worker

# After one rank raises, how long the others get to finish before they count as stuck behind it.
PEER_GRACE_S = 3.0


class RankFailure(RuntimeError):
    """A case hung or a rank died; the message names the rank(s) and carries their stacks or signals."""


@dataclass
class PoolResult:
    """The replies of every rank to one case."""

    # Per rank: the callable's return value (None where it raised).
    results: list[Any]
    # rank -> traceback, for ranks whose callable raised.
    errors: dict[int, str]
    # Caller wall time minus the slowest rank's compute time: what the pool itself cost.
    overhead_s: float
    # Caller wall time for the whole case.
    wall_s: float

    def raise_errors(self, what: str) -> None:
        if self.errors:
            parts = [f"rank {r} raised:\n{tb}" for r, tb in sorted(self.errors.items())]
            raise RankFailure(f"{what}: " + "\n".join(parts))


def backend_for(device_type: str) -> str:
    """The process-group backend for ranks on `device_type`: nccl on GPUs, gloo on the CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


def process_gone(pid: int) -> bool:
    """True when `pid` does not exist or is a zombie (no longer running)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is `pgid` (a rank and anything it started)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


@dataclass
class RankPool:
    """N ranks joined in one process group, fed cases over pipes."""

    # Number of ranks.
    world_size: int = 2
    # "gloo" or "nccl"; None picks by the device (nccl for cuda, gloo for cpu).
    backend: str | None = None
    # The caller's device ("cpu", or "cuda:k" for xdist worker k's GPU): rank r runs on GPU (k + r) mod n.
    device: str = "cpu"
    # Default per-case timeout in seconds.
    case_timeout_s: float = 60.0
    # Time allowed for all ranks to start and rendezvous.
    start_timeout_s: float = 120.0
    # What the running ranks have imported (a wrapper's or engine's name): a name's first case in a pool may also
    # take start_timeout_s, the time to import its stack (TE over the emulation, Megatron, DeepSpeed: over 60 s in
    # the ranks of a loaded 2-core machine), which is not the case's own time.
    imported: set[str] = field(default_factory=set)
    # Per-case pool overheads measured so far (seconds), for the median/max figures.
    overheads: list[float] = field(default_factory=list)
    # How many times a pool was started (1 + rebuilds).
    starts: int = 0
    # Running ranks, their pipes and the temporary directory of the current pool.
    _procs: list = field(default_factory=list, repr=False)
    _conns: list = field(default_factory=list, repr=False)
    _tmpdir: str | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return bool(self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def rank_devices(self) -> list[str]:
        """One device per rank; DeviceError when the world does not fit the GPUs this process sees."""
        import torch

        first = torch.device(self.device)
        gpus = torch.cuda.device_count() if first.type == "cuda" else 0
        return [str(d) for d in run_device.rank_devices(first, self.world_size, gpus)]

    def start(self) -> None:
        """Spawn the ranks and wait until every one has joined the process group."""
        if self.running:
            return
        import torch

        devices = self.rank_devices()
        backend = self.backend or backend_for(torch.device(self.device).type)
        ctx = multiprocessing.get_context("spawn")
        self._tmpdir = tmpdirs.make("te_verify_pool")
        init_file = os.path.join(self._tmpdir, "store")
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            dump = os.path.join(self._tmpdir, f"stack{rank}.txt")
            proc = ctx.Process(target=worker.rank_main, name=f"te_verify-rank{rank}", daemon=True,
                               args=(rank, self.world_size, init_file, backend, devices[rank], child, dump,
                                     self.case_timeout_s))
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self.starts += 1
        self.imported = set()
        replies = self._collect(self.start_timeout_s, "pool start")
        if any(r.error for r in replies.values()):
            failure = "; ".join(f"rank {r}: {rep.error}" for r, rep in replies.items() if rep.error)
            self.close()
            raise RankFailure(f"pool start failed: {failure}")

    def run(self, fn: Callable[[int, int, Any], Any], payload: Any, timeout_s: float | None = None,
            imports: str | None = None) -> PoolResult:
        """Run fn(rank, world_size, payload) on every rank; RankFailure (pool rebuilt next time) on hang/crash.
        `imports` names the stack the case imports in the ranks: its first case in this pool gets start_timeout_s
        more."""
        self.start()
        began = time.perf_counter()
        message = worker.CaseMessage(fn, payload, sys_path=_sys_path())
        for conn in self._conns:
            worker.send(conn, message)
        limit = timeout_s or self.case_timeout_s
        if imports is not None and imports not in self.imported:
            limit += self.start_timeout_s
        replies = self._collect(limit, _describe(fn, payload))
        if imports is not None:
            self.imported.add(imports)
        wall = time.perf_counter() - began
        errors = {r: rep.error for r, rep in replies.items() if rep.error}
        if errors and len(errors) < self.world_size:
            self.close()  # ranks disagree: the survivors' collective sequence may be out of step
        overhead = max(0.0, wall - max(rep.compute_s for rep in replies.values()))
        self.overheads.append(overhead)
        results = [replies[r].result for r in range(self.world_size)]
        return PoolResult(results, errors, overhead, wall)

    def _collect(self, timeout_s: float, what: str) -> dict[int, worker.RankReply]:
        """Wait for one reply per rank; on timeout or death, tear down and raise RankFailure naming the rank."""
        deadline = time.monotonic() + timeout_s
        replies: dict[int, worker.RankReply] = {}
        conn_rank = {id(c): r for r, c in enumerate(self._conns)}
        sentinel_rank = {p.sentinel: r for r, p in enumerate(self._procs)}
        while len(replies) < self.world_size:
            pending = [c for r, c in enumerate(self._conns) if r not in replies]
            watch = pending + [p.sentinel for r, p in enumerate(self._procs) if r not in replies]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(what, replies, f"no reply within {timeout_s:g} s")
            for ready in wait(watch, timeout=remaining):
                if isinstance(ready, int):
                    rank = sentinel_rank[ready]
                    if rank not in replies and not self._conns[rank].poll():
                        self._fail(what, replies, "", dead_rank=rank)
                    continue
                rank = conn_rank[id(ready)]
                try:
                    replies[rank] = worker.recv(ready)
                except (EOFError, OSError):
                    self._fail(what, replies, "", dead_rank=rank)
                if replies[rank].error:
                    deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
        return replies

    def _fail(self, what: str, replies: dict, why: str, dead_rank: int | None = None) -> None:
        """Describe every rank's state, tear the pool down, raise RankFailure."""
        stacks = self._dump_stacks([r for r in range(self.world_size) if r not in replies and r != dead_rank])
        lines = []
        for rank, proc in enumerate(self._procs):
            if rank == dead_rank:
                proc.join(timeout=1.0)
                lines.append(f"rank {rank} died: {signal_name(proc.exitcode)}")
            elif rank in replies:
                rep = replies[rank]
                lines.append(f"rank {rank} raised:\n{rep.error}" if rep.error else f"rank {rank} finished")
            else:
                lines.append(f"rank {rank} hung ({why or 'stuck behind a failed peer'}); its stack:\n{stacks.get(rank, '?')}")
        self.close()
        raise RankFailure(f"{what}: " + "\n".join(lines))

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Ask hung ranks for their Python stacks (faulthandler on SIGUSR1) and read the dumps."""
        for rank in ranks:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if ranks:
            time.sleep(0.3)
        stacks = {}
        for rank in ranks:
            path = os.path.join(self._tmpdir or "", f"stack{rank}.txt")
            try:
                with open(path) as f:
                    stacks[rank] = f.read().strip() or "(no stack dumped)"
            except OSError:
                stacks[rank] = "(no stack dump file)"
        return stacks

    def close(self, graceful: bool = False) -> None:
        """Stop every rank (politely if `graceful`), kill their process groups, reap, verify none is left."""
        if graceful:
            for conn in self._conns:
                try:
                    worker.send(conn, worker.STOP)
                except OSError:
                    pass
            for proc in self._procs:
                proc.join(timeout=5.0)
        for proc in self._procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._procs:
            proc.join(timeout=10.0)
        left = [pid for proc in self._procs for pid in [proc.pid, *group_members(proc.pid)] if not process_gone(pid)]
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmpdir:
            tmpdirs.remove(self._tmpdir)
            self._tmpdir = None
        if left:
            raise RankFailure(f"pool teardown left processes running: {sorted(set(left))}")

    def overhead_figures(self) -> dict[str, float]:
        """Median and max per-case overhead so far, skipping the first case (warm-up)."""
        warm = self.overheads[1:] or self.overheads
        if not warm:
            return {}
        return {"overhead_median_s": statistics.median(warm), "overhead_max_s": max(warm)}


def _sys_path() -> list[str]:
    import sys

    return [p for p in sys.path if p]


def _describe(fn: Callable, payload: Any) -> str:
    ident = getattr(payload, "id", None) or repr(payload)[:120]
    return f"case {ident} ({getattr(fn, '__qualname__', fn)})"
