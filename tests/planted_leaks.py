"""Backends that leave one process setting changed after their case (tests/test_process_state.py): each is eager
PyTorch (or te_eager), correct in every value, except that it changes its setting whenever one of its forward outputs
is freed and changes it back at the start of its next forward. Its own forwards and backward passes therefore run as
eager's would, and only what it leaves after its last step differs: the leak of issue 25 (a backend that left grad
mode disabled passed its own case; the next case failed, blamed on eager).
Usable as external backends (`--backend planted_leaks:LeavesGradModeOff`).
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch

from planted_backends import _Planted
from te_verify.te import api as te_api
from te_verify.backends.te_eager import TEEagerBackend


class _LeavesSetting(_Planted):
    """Correct; leaves its setting changed (`leak`, returning what changes it back) after its last forward."""

    def __init__(self) -> None:
        self.undo: Callable[[], None] | None = None

    def leak(self) -> Callable[[], None]:
        raise NotImplementedError

    def _leak(self) -> None:
        if self.undo is None:
            self.undo = self.leak()

    def leaky(self, forward: Callable) -> Callable:
        def call(x: torch.Tensor) -> torch.Tensor:
            if self.undo is not None:
                self.undo()
                self.undo = None
            out = forward(x)
            weakref.finalize(out, self._leak).atexit = False
            return out
        return call

    def prepare(self, model, spec):
        return self.leaky(model)


def _setter(read: Callable, write: Callable, value) -> Callable[[], Callable[[], None]]:
    """leak(): write `value`; what it returns writes back what was there."""
    def leak() -> Callable[[], None]:
        was = read()
        write(value)
        return lambda: write(was)
    return leak


class LeavesGradModeOff(_LeavesSetting):
    name = "planted_leaves_grad_mode_off"
    leak = staticmethod(_setter(torch.is_grad_enabled, torch.set_grad_enabled, False))


class LeavesDefaultDtypeFloat64(_LeavesSetting):
    name = "planted_leaves_default_dtype_float64"
    leak = staticmethod(_setter(torch.get_default_dtype, torch.set_default_dtype, torch.float64))


class LeavesDeterministicAlgorithms(_LeavesSetting):
    name = "planted_leaves_deterministic_algorithms"
    leak = staticmethod(_setter(torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, True))


class LeavesOneThread(_LeavesSetting):
    name = "planted_leaves_one_thread"
    leak = staticmethod(_setter(torch.get_num_threads, torch.set_num_threads, 1))


class LeavesMatmulPrecisionMedium(_LeavesSetting):
    name = "planted_leaves_matmul_precision_medium"
    leak = staticmethod(_setter(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "medium"))


class LeavesMatmulPrecisionHigh(_LeavesSetting):
    name = "planted_leaves_matmul_precision_high"
    leak = staticmethod(_setter(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "high"))


class LeavesAutocastEntered(_LeavesSetting):
    """Enters torch.autocast (CPU, bfloat16) and does not leave it."""

    name = "planted_leaves_autocast_entered"

    def leak(self) -> Callable[[], None]:
        region = torch.autocast("cpu", dtype=torch.bfloat16)
        region.__enter__()
        return lambda: region.__exit__(None, None, None)


class LeavesFP8AutocastEntered(_LeavesSetting, TEEagerBackend):
    """te_eager, leaving a TE autocast region entered (FP8 off in it: leaving an FP8 one would also run TE's amax
    reduction again when it is finally left, changing the run's own scales)."""

    name = "planted_leaves_fp8_autocast_entered"
    lane = "te"

    def leak(self) -> Callable[[], None]:
        region = te_api.active().api.autocast(enabled=False)
        region.__enter__()
        return lambda: region.__exit__(None, None, None)

    def prepare(self, model, spec):
        stack = TEEagerBackend.prepare(self, model, spec)
        stack.forward = self.leaky(stack.forward)  # the TE modules' own autocast region runs inside
        return stack
