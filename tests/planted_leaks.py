"""Backends that leave one process setting changed after their case (tests/test_process_state.py): each is eager
PyTorch (or te_eager), correct in every value, except that it changes its setting whenever one of its forward outputs
is freed and changes it back at the start of its next forward. Its own forwards and backward passes therefore run as
eager's would, and only what it leaves after its last step differs: the leak of issue 25 (a backend that left grad
mode disabled passed its own case; the next case failed, blamed on eager). The routing leaks at the end
(tests/test_process_routing.py) are made in prepare() and skew the backend's own GEMMs too (issue 36, item 5).
Usable as external backends (`--backend planted_leaks:LeavesGradModeOff`).
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

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
    """Leaves one intra-op thread more than it found (a worker may run at one already: te_verify/run/worker_threads.py)."""
    name = "planted_leaves_one_thread"

    @staticmethod
    def leak() -> Callable[[], None]:
        was = torch.get_num_threads()
        torch.set_num_threads(was + 1)
        return lambda: torch.set_num_threads(was)


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


# What torch routes a call through (te_verify.run.torch_routing), left changed by prepare(): from then on every run in
# the process computes through it unless the harness pops the mode or puts the method back (issue 36, item 5).
SKEW = 1 + 1e-3  # the planted kernels' error: every GEMM's output 1e-3 off
SKEWED_FUNCTIONS = {torch.nn.functional.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}
SKEWED_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


class SkewedLinearMode(TorchFunctionMode):
    """A tracer's torch-function mode routing F.linear and matmul through a kernel 1e-3 off."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * SKEW if func in SKEWED_FUNCTIONS else out


class SkewedGemmDispatch(TorchDispatchMode):
    """A dispatch mode routing aten's mm and addmm through a kernel 1e-3 off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * SKEW if func in SKEWED_OPS else out


class LeavesFunctionMode(_Planted):
    """prepare() enters SkewedLinearMode and never exits it."""

    name = "planted_leaves_function_mode"

    def prepare(self, model, spec):
        SkewedLinearMode().__enter__()
        return model


class LeavesDispatchMode(_Planted):
    """prepare() enters SkewedGemmDispatch and never exits it."""

    name = "planted_leaves_dispatch_mode"

    def prepare(self, model, spec):
        SkewedGemmDispatch().__enter__()
        return model


def skewed_forward(original: Callable) -> Callable:
    def forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return original(module, x) * SKEW
    return forward


class PatchesLinearForward(_Planted):
    """prepare() replaces torch.nn.Linear.forward on the class (1e-3 off) and never puts it back."""

    name = "planted_patches_linear_forward"

    def prepare(self, model, spec):
        torch.nn.Linear.forward = skewed_forward(torch.nn.Linear.forward)
        return model
