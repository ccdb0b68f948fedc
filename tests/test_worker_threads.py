"""Each xdist worker takes its share of the cores for torch's intra-op threads (te_verify/run/worker_threads.py):
C // N, at least one; left alone outside a worker or where the user set OMP_NUM_THREADS. The process's thread count is
restored after each test."""
import contextlib

import pytest
import torch

from te_verify.run import worker_threads


@contextlib.contextmanager
def threads_restored():
    """The process's intra-op thread count put back before the test ends (the run's leftover check reads it)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("workers, cores, want", [(2, 2, 1), (1, 2, 2), (4, 16, 4), (3, 2, 1), (0, 8, 8)])
def test_each_worker_gets_its_share_of_the_cores(workers, cores, want):
    assert worker_threads.threads_per_worker(workers, cores) == want


def test_a_worker_sets_its_share(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr(worker_threads, "_cores", lambda: 2)
    with threads_restored():
        torch.set_num_threads(2)
        assert worker_threads.share_cores(True) == 1 and torch.get_num_threads() == 1
    assert "1 per worker (2 cores, 2 workers)" == worker_threads.describe(2)


@pytest.mark.parametrize("is_worker, omp", [(False, None), (True, "3")])
def test_outside_a_worker_or_under_the_users_omp_setting_nothing_changes(monkeypatch, is_worker, omp):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    with threads_restored():
        torch.set_num_threads(2)
        assert worker_threads.share_cores(is_worker) is None and torch.get_num_threads() == 2
