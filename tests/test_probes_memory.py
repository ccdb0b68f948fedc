"""PeakMemoryProbe on CPU: live-storage tracking, the backward window, frees, and idle (harness) phases."""
from __future__ import annotations

import torch

from te_verify.probes.memory import PeakMemoryProbe

MB = 1 << 20


def test_peak_counts_a_backward_temporary_and_frees_it():
    x = torch.randn(16, 16, requires_grad=True)
    with PeakMemoryProbe() as probe:
        probe.phase("forward")
        y = x * 2.0  # 1 KiB, alive until the end
        probe.phase("backward", 1)
        temp = torch.zeros(MB // 4)  # 1 MiB of float32
        del temp
        after = torch.ones(4)
    figures = probe.figures()
    assert figures["peak_backward_bytes"] == 1024 + MB
    assert figures["peak_bytes"] == 1024 + MB
    assert y.requires_grad and after.numel() == 4


def test_forward_peak_is_not_a_backward_peak_and_views_are_free():
    with PeakMemoryProbe() as probe:
        probe.phase("forward")
        big = torch.zeros(MB // 4)
        view = big[10:]
        del big, view
        probe.phase("backward", 1)
        small = torch.zeros(256)
    figures = probe.figures()
    assert figures["peak_bytes"] == MB
    assert figures["peak_backward_bytes"] == 1024
    assert small.numel() == 256


def test_idle_phase_is_not_counted():
    with PeakMemoryProbe() as probe:
        probe.phase("forward")
        kept = torch.zeros(256)
        probe.phase("idle")
        snapshot = torch.zeros(MB // 4)
    assert probe.figures()["peak_bytes"] == 1024
    assert kept.numel() and snapshot.numel()
