"""Where the suite's tensors live: the `--device` choice, one GPU per xdist worker, the distributed pool's GPUs.

Every tensor the suite makes (models, inputs, cotangents, main_grad, the distributed ranks' shards and gathers)
names its device, read from `active()`; nothing relies on torch's default device, which a user's process or
library may have changed.

On a multi-GPU runner xdist worker k ("gw<k>") uses GPU k mod n, bound before anything initialises CUDA, so
`pytest -n <gpus>` spreads the work; the distributed pool of that worker puts rank r on GPU (k + r) mod n,
distinct GPUs because nccl forbids two ranks of one communicator on one GPU.
"""
from __future__ import annotations

import platform
import re

import torch

KINDS = ("cpu", "cuda")
_CHOICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


class DeviceError(ValueError):
    """An unusable --device, or a world that does not fit the GPUs; the message is one line naming it."""


def worker_index(worker_id: str | None) -> int:
    """"gw3" -> 3; 0 outside xdist (or for the controller)."""
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else 0


def worker_gpu(worker_id: str | None, gpu_count: int) -> int:
    """The GPU of xdist worker `worker_id` when the process sees `gpu_count` GPUs: worker k uses GPU k mod n."""
    return worker_index(worker_id) % gpu_count


def resolve(choice: str | None, worker_id: str | None = None, gpu_count: int | None = None) -> torch.device:
    """The device for `--device choice` (None: cuda when available, else cpu) in xdist worker `worker_id`.

    `cuda` without an index means this worker's GPU; `cuda:N` pins GPU N. `gpu_count` defaults to what torch
    sees (tests pass a simulated count)."""
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    if choice in (None, "", "auto"):
        choice = "cuda" if count > 0 else "cpu"
    match = _CHOICE.match(choice)
    if match is None:
        raise DeviceError(f"--device {choice!r}: expected cpu, cuda or cuda:N")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise DeviceError(f"--device {choice!r}: the CPU has no index; use --device cpu")
        return torch.device("cpu")
    if count < 1:
        raise DeviceError(f"--device {choice}: no CUDA device on this machine (torch {torch.__version__}); "
                          f"use --device cpu")
    if index is not None and int(index) >= count:
        raise DeviceError(f"--device {choice}: this process sees {count} CUDA device(s) (0..{count - 1})")
    return torch.device("cuda", int(index) if index is not None else worker_gpu(worker_id, count))


def torchrun_device(choice: str | None, local_rank: int, gpu_count: int | None = None) -> torch.device:
    """A torchrun rank's device: GPU LOCAL_RANK of its node (one rank per GPU, as nccl requires), or the CPU."""
    device = resolve(choice, gpu_count=gpu_count)
    if device.type == "cpu":
        return device
    if choice and ":" in choice:
        raise DeviceError(f"--device {choice}: under torchrun each rank takes GPU LOCAL_RANK; use --device cuda")
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    if local_rank >= count:
        raise DeviceError(f"LOCAL_RANK {local_rank}: this node sees {count} GPU(s); start at most {count} ranks "
                          f"per node (nccl forbids two ranks on one GPU)")
    return torch.device("cuda", local_rank)


def rank_devices(device: torch.device, world_size: int, gpu_count: int) -> list[torch.device]:
    """One device per rank of a distributed world started from `device`: the CPU for every rank, or distinct
    GPUs from `device`'s on (rank r on GPU (first + r) mod n). A world larger than the GPUs seen is refused."""
    if device.type != "cuda":
        return [device] * world_size
    if world_size > gpu_count:
        raise DeviceError(f"world size {world_size} needs {world_size} GPUs (nccl forbids two ranks on one GPU); "
                          f"this worker sees {gpu_count}")
    first = device.index or 0
    return [torch.device("cuda", (first + rank) % gpu_count) for rank in range(world_size)]


def bind(device: torch.device) -> None:
    """Make `device` current for this process (its GPU), so CUDA's context and TE's current_device() are there."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def use(device: torch.device) -> torch.device:
    """Bind and activate `device` for this process (a test process, a pool rank or a torchrun rank)."""
    bind(device)
    activate(device)
    return device


_ACTIVE: list[torch.device] = []


def activate(device: torch.device) -> None:
    """The device every tensor of this process's cases is made on."""
    _ACTIVE[:] = [device]


def active() -> torch.device:
    """The activated device (the default for this machine until one is activated)."""
    if not _ACTIVE:
        _ACTIVE.append(resolve(None))
    return _ACTIVE[0]


def describe() -> str:
    """The run's device, kind first: "cuda: NVIDIA H100 80GB HBM3 x8" or "cpu: x86_64"."""
    active_device = active()
    if active_device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(active_device)} x{torch.cuda.device_count()}"
    return f"cpu: {platform.processor() or platform.machine()}"
