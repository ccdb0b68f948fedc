"""--device: resolution with simulated GPU counts, one GPU per xdist worker, the distributed pool's and torchrun's
GPU checks, backends that cannot run on the chosen device, and the seeded tensors naming their device."""
from __future__ import annotations

import pytest
import torch

from te_verify import device as run_device
from te_verify.te import api as te_api
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.backends.thunder_te import ThunderTEBackend
from te_verify.distributed.pool.pool import RankPool
from te_verify.matrix.stacks import freeze_specs
from te_verify.models import build_model, make_inputs

CPU = torch.device("cpu")


def cuda(index: int) -> torch.device:
    return torch.device("cuda", index)


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
def test_worker_k_takes_gpu_k_mod_n(gpus):
    assert [run_device.resolve("cuda", f"gw{k}", gpus) for k in range(16)] == [cuda(k % gpus) for k in range(16)]


def test_as_many_workers_as_gpus_use_every_gpu_once():
    assert sorted(run_device.resolve(None, f"gw{k}", 8).index for k in range(8)) == list(range(8))


def test_default_is_cuda_when_gpus_are_seen_else_cpu():
    assert run_device.resolve(None, "gw3", gpu_count=2) == cuda(1)
    assert run_device.resolve(None, None, gpu_count=0) == CPU
    assert run_device.resolve("cpu", "gw3", gpu_count=2) == CPU  # --device cpu on a GPU runner


def test_an_explicit_index_pins_every_worker_to_that_gpu():
    assert {run_device.resolve("cuda:2", f"gw{k}", 4) for k in range(4)} == {cuda(2)}


@pytest.mark.parametrize("choice, gpus, culprit", [
    ("tpu", 0, "--device 'tpu': expected cpu, cuda or cuda:N"),
    ("cpu:1", 0, "--device 'cpu:1': the CPU has no index"),
    ("cuda", 0, "--device cuda: no CUDA device on this machine"),
    ("cuda:4", 4, "--device cuda:4: this process sees 4 CUDA device(s) (0..3)"),
])
def test_bad_device_is_a_one_line_error_naming_it(choice, gpus, culprit):
    with pytest.raises(run_device.DeviceError) as info:
        run_device.resolve(choice, "gw0", gpus)
    assert culprit in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("first, world, gpus, want", [
    (cuda(0), 2, 2, [cuda(0), cuda(1)]),
    (cuda(3), 2, 4, [cuda(3), cuda(0)]),  # worker 3 of 4: its pool wraps round to GPU 0
    (cuda(1), 4, 4, [cuda(1), cuda(2), cuda(3), cuda(0)]),
    (CPU, 4, 0, [CPU] * 4),
])
def test_pool_ranks_sit_on_distinct_gpus(first, world, gpus, want):
    assert run_device.rank_devices(first, world, gpus) == want


def test_pool_refuses_a_world_larger_than_the_gpus_seen(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    pool = RankPool(world_size=2, device="cuda:0")
    with pytest.raises(run_device.DeviceError, match=r"world size 2 needs 2 GPUs \(nccl forbids two ranks on one "
                                                     r"GPU\); this worker sees 1"):
        pool.rank_devices()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert RankPool(world_size=2, device="cuda:3").rank_devices() == ["cuda:3", "cuda:0"]
    assert RankPool(world_size=2).rank_devices() == ["cpu", "cpu"]


def test_torchrun_rank_takes_gpu_local_rank_of_its_node():
    assert run_device.torchrun_device("cuda", 1, gpu_count=2) == cuda(1)
    assert run_device.torchrun_device(None, 3, gpu_count=0) == CPU
    with pytest.raises(run_device.DeviceError, match=r"LOCAL_RANK 2: this node sees 2 GPU\(s\); start at most 2"):
        run_device.torchrun_device("cuda", 2, gpu_count=2)
    with pytest.raises(run_device.DeviceError, match=r"under torchrun each rank takes GPU LOCAL_RANK"):
        run_device.torchrun_device("cuda:1", 0, gpu_count=2)


@pytest.fixture
def on_device():
    """Activate a device for the block (a CUDA one needs no GPU to be named), restoring the previous one."""
    previous = run_device.active()
    yield run_device.activate
    run_device.activate(previous)


@pytest.mark.parametrize("backend", [TEEagerBackend(), ThunderTEBackend()], ids=lambda b: b.name)
def test_te_backends_over_the_emulation_skip_on_cuda_with_the_reason(backend, on_device):
    with te_api.using(te_api.resolve(te_api.CPU_CHOICE)):
        on_device(cuda(0))
        ok, reason = backend.available()
    assert not ok and "emulates TE's C++ on the CPU only, not on --device cuda:0" in reason


def test_real_te_skips_on_the_cpu_with_the_reason():
    real = te_api.TEImpl("transformer_engine", te_api.REAL, "test", "real TE", lambda: None)
    assert te_api.device_reason(real, CPU) == "--te-impl transformer_engine runs TE's kernels on CUDA, not on --device cpu"
    assert te_api.device_reason(real, cuda(0)) is None


def test_models_and_inputs_name_their_device_under_a_poisoned_default():
    spec = freeze_specs("smoke")[0]
    with torch.device("meta"):  # what torch.set_default_device("meta") does, for this block only
        assert torch.nn.Linear(2, 2).weight.is_meta  # the poison bites code that does not name a device
        model, inputs = build_model(spec, CPU), make_inputs(spec, device=CPU)
    assert {p.device for p in model.parameters()} == {CPU}
    assert inputs.x.device == inputs.grad_output.device == CPU

