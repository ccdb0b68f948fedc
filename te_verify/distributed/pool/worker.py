"""The rank main loop of the persistent pool: join the process group once, then run cases until told to stop.

Messages on the pipe are plain pickles (not multiprocessing's ForkingPickler) so tensors travel by value
and no shared-memory handles outlive a rank that gets killed.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

STOP = "stop"


@dataclass
class CaseMessage:
    """One case sent to every rank."""

    # Module-level callable run as fn(rank, world_size, payload); pickled by reference.
    fn: Callable[[int, int, Any], Any]
    # The case's argument (a CaseSpec or anything picklable).
    payload: Any
    # sys.path entries the caller has that the rank may lack (e.g. a test directory added after spawn).
    sys_path: list[str] = field(default_factory=list)


@dataclass
class RankReply:
    """What one rank sends back for one case."""

    # The rank that ran the case.
    rank: int
    # The callable's return value (None when it raised).
    result: Any = None
    # Formatted traceback when the callable raised, else None.
    error: str | None = None
    # Seconds the callable took inside the rank (the pool's overhead is the rest).
    compute_s: float = 0.0


def send(conn, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn) -> Any:
    return pickle.loads(conn.recv_bytes())


def init_process_group(rank: int, world_size: int, init_file: str, backend: str, timeout_s: float) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def die_with_parent() -> None:
    """Linux: SIGKILL this rank when the process that spawned it dies, so a killed pytest leaves no rank."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def set_rank_env(rank: int, world_size: int) -> None:
    """The variables torchrun would set; thunder's fsdp reads LOCAL_RANK."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size))


def run_one(rank: int, world_size: int, message: CaseMessage) -> RankReply:
    for path in message.sys_path:
        if path not in sys.path:
            sys.path.append(path)
    start = time.perf_counter()
    try:
        result = message.fn(rank, world_size, message.payload)
    except BaseException:  # noqa: BLE001 -- any failure of the case goes back to the caller with its traceback
        return RankReply(rank, error=traceback.format_exc(), compute_s=time.perf_counter() - start)
    return RankReply(rank, result=result, compute_s=time.perf_counter() - start)


def rank_main(rank: int, world_size: int, init_file: str, backend: str, device: str, conn, dump_path: str,
              timeout_s: float) -> None:
    """Entry point of one pool rank (a spawned process)."""
    os.setpgid(0, 0)  # own process group, so the pool can kill this rank and anything it started at once
    die_with_parent()
    dump = open(dump_path, "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)  # the pool asks hung ranks for stacks
    set_rank_env(rank, world_size)
    import torch

    torch.set_num_threads(1)  # N ranks per xdist worker share few cores; oversubscription only adds jitter
    from te_verify import device as run_device

    run_device.use(torch.device(device))  # before the process group: nccl binds its communicator to the current GPU
    init_process_group(rank, world_size, init_file, backend, timeout_s)
    send(conn, RankReply(rank, result="ready"))
    while True:
        try:
            message = recv(conn)
        except (EOFError, OSError):  # the caller went away
            break
        if message == STOP:
            break
        send(conn, run_one(rank, world_size, message))
    conn.close()
    # No destroy_process_group(): with FSDP2 it aborted in 2 of 16 runs on 2.13 (notes, cf. PR #179291).
    os._exit(0)
