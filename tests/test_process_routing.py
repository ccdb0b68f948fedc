"""What torch routes a call through, left changed by a case (issue 36, item 5): te_verify.run.torch_routing's modes
on the torch-function and dispatch stacks and torch's callables, each named and put back by process_state; planted
backends (tests/planted_leaks.py) whose prepare() leaves a torch-function mode, a dispatch mode or a patched
torch.nn.Linear.forward, each skewing GEMMs 1e-3: the culprit fails naming its leak, and eager run after it in the
same process has exactly its verdicts and figures alone (without the restore eager, its fp64 truth and the backend
would all compute through the leak and agree). Clean twins: modes entered and exited, a method patched and put back,
inside the backend's call.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo.mutation_guard
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from planted_leaks import LeavesDispatchMode, LeavesFunctionMode, PatchesLinearForward, SkewedGemmDispatch, \
    SkewedLinearMode
from te_verify.backends.eager import EagerBackend
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.run import process_state
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec

SPEC = CaseSpec("bias", (32, 64, 32), (False, True), (True, True), True, (8,), "fp32", 1)
LINEAR_FORWARD = torch.nn.Linear.forward
MATMUL = torch.Tensor.__dict__.get("matmul")


def _patch_linear_forward() -> None:
    torch.nn.Linear.forward = lambda module, x: x


def _shadow_tensor_matmul() -> None:
    torch.Tensor.matmul = lambda self, other: other  # shadows TensorBase.matmul


def _replace_torch_mm() -> None:
    torch.mm = lambda a, b: a


def _delete_module_forward() -> None:
    del torch.nn.Identity.forward


# (what the block does, what restore must say it left).
LEAKS = {
    "torch-function mode": (lambda: SkewedLinearMode().__enter__(),
                            ["left the torch-function mode stack: planted_leaks.SkewedLinearMode entered, never "
                             "exited"]),
    "dispatch mode": (lambda: SkewedGemmDispatch().__enter__(),
                      ["left the dispatch mode stack: planted_leaks.SkewedGemmDispatch entered, never exited"]),
    "class method": (_patch_linear_forward, ["left torch.nn.Linear.forward replaced by "
                                             "test_process_routing._patch_linear_forward.<locals>.<lambda>"]),
    "shadowed Tensor method": (_shadow_tensor_matmul, [
        "left torch.Tensor.matmul set to test_process_routing._shadow_tensor_matmul.<locals>.<lambda> (inherited "
        "before)"]),
    "torch function": (_replace_torch_mm, ["left torch.mm replaced by test_process_routing._replace_torch_mm."
                                           "<locals>.<lambda>"]),
    "deleted method": (_delete_module_forward, ["left torch.nn.Identity.forward deleted"]),
}


@pytest.mark.parametrize("leak", list(LEAKS))
def test_each_routing_leak_is_named_and_put_back(leak):
    change, expected = LEAKS[leak]
    mm, identity_forward = torch.mm, torch.nn.Identity.forward
    with process_state.kept() as found:
        change()
    assert found.messages == expected
    assert torch._C._len_torch_function_stack() == 0 and torch._C._len_torch_dispatch_stack() == 0
    assert torch.nn.Linear.forward is LINEAR_FORWARD and torch.Tensor.__dict__.get("matmul") is MATMUL
    assert torch.mm is mm and torch.nn.Identity.forward is identity_forward


def test_a_mode_the_run_exited_is_entered_again_and_data_is_not_judged():
    """A mode entered before the run and popped by it is named and pushed back; a name added where nothing is
    inherited (te_verify.compat's stand-ins for methods torch removed) and data (a lazily added __annotations__)
    are neither judged nor undone."""
    with SkewedLinearMode() as outer:
        with process_state.kept() as found:
            torch._C._pop_torch_function_stack()
            torch.Tensor.removed_method_stand_in = lambda self: None
            torch.nn.Identity.__annotations__ = {}
        assert found.messages == ["left the torch-function mode stack: planted_leaks.SkewedLinearMode exited "
                                  "(entered before the run)"]
        assert torch._C._get_function_stack_at(0) is outer
    assert hasattr(torch.Tensor, "removed_method_stand_in") and "__annotations__" in vars(torch.nn.Identity)
    del torch.Tensor.removed_method_stand_in, torch.nn.Identity.__annotations__


IMPORT_TIME_PATCH = """\
import torch

def extra_repr(self):
    return "patched as the library loads"

torch.nn.Linear.extra_repr = extra_repr
"""


def test_a_library_patching_torch_as_it_loads_is_the_environment(tmp_path, monkeypatch):
    """Imported in the run, a library's import-time patch (TE's Module.float, lightning's torch.compile wrapper) is
    neither judged nor undone: it happens once per process, in whichever run first imports the library; so is
    dynamo's patch of Module.__init__ at the first torch.compile (installed before any snapshot)."""
    (tmp_path / "patches_as_it_loads.py").write_text(IMPORT_TIME_PATCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    original = torch.nn.Linear.extra_repr
    try:
        with process_state.kept() as found:
            import patches_as_it_loads
            torch._dynamo.mutation_guard.install_generation_tagging_init()
        assert found.messages == [] and torch.nn.Linear.extra_repr is patches_as_it_loads.extra_repr
    finally:
        torch.nn.Linear.extra_repr = original


def _verdicts(case: CaseRun) -> list[Verdict]:
    try:
        return case.verify()
    except CheckFailures as exc:
        return exc.verdicts


def _judged(verdicts: list[Verdict]) -> list[tuple]:
    return [(v.check, v.ok, v.message, v.figures) for v in verdicts]


_ALONE: list[list[tuple]] = []


def _eager_alone() -> list[tuple]:
    if not _ALONE:
        _ALONE.append(_judged(_verdicts(CaseRun(SPEC, "eager", EagerBackend()))))
    return _ALONE[0]


@pytest.mark.parametrize("culprit, left", [
    (LeavesFunctionMode, "left the torch-function mode stack: planted_leaks.SkewedLinearMode entered, never exited"),
    (LeavesDispatchMode, "left the dispatch mode stack: planted_leaks.SkewedGemmDispatch entered, never exited"),
    (PatchesLinearForward, "left torch.nn.Linear.forward replaced by planted_leaks.skewed_forward.<locals>.forward"),
], ids=lambda p: p.__name__ if isinstance(p, type) else "")
def test_the_culprit_fails_naming_its_leak_and_eager_after_it_is_judged_alone(culprit, left):
    alone = _eager_alone()
    failed = {v.check: v.message for v in _verdicts(CaseRun(SPEC, culprit.name, culprit())) if not v.ok}
    assert failed["process_state"] == f"[{SPEC.id}] backend {culprit.name}: {left}"
    assert "output_parity" in failed, failed  # its own GEMMs were skewed; the truth after it was not
    assert torch.nn.Linear.forward is LINEAR_FORWARD
    assert _judged(_verdicts(CaseRun(SPEC, "eager", EagerBackend()))) == alone


@pytest.mark.parametrize("culprit", [LeavesFunctionMode, LeavesDispatchMode, PatchesLinearForward],
                         ids=lambda c: c.__name__)
def test_left_in_place_the_leak_passes_eager_on_other_figures(culprit):
    """What the restore prevents (issue 36): with the leak left in place, eager's reference, the backend and the fp64
    truth all compute through it and agree: every check passes, on figures that are not eager's alone."""
    alone = _eager_alone()
    with process_state.kept():
        culprit().prepare(None, SPEC)
        leaked = _judged(_verdicts(CaseRun(SPEC, "eager", EagerBackend())))
    assert all(ok for _, ok, _, _ in leaked) and leaked != alone


class _Counting(TorchFunctionMode):
    """A tracer: counts the torch functions called, computes each as torch does."""

    calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        type(self).calls += 1
        return func(*args, **(kwargs or {}))


class _CountingDispatch(TorchDispatchMode):
    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        type(self).calls += 1
        return func(*args, **(kwargs or {}))


class EntersModesInside:
    """Correct: a torch-function mode and a dispatch mode entered and exited within each forward call."""

    name = "enters_modes_inside"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model, spec):
        def forward(x):
            with _Counting(), _CountingDispatch():
                return model(x)
        return forward


def _linear_written_differently(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = x @ module.weight.t()
    return out if module.bias is None else out + module.bias


class PatchesAndRestores:
    """Correct: torch.nn.Linear.forward replaced by an equal computation written differently inside each forward
    call, the original put back before it returns."""

    name = "patches_and_restores"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model, spec):
        def forward(x):
            original, torch.nn.Linear.forward = torch.nn.Linear.forward, _linear_written_differently
            try:
                return model(x)
            finally:
                torch.nn.Linear.forward = original
        return forward


@pytest.mark.parametrize("backend", [EntersModesInside(), PatchesAndRestores()], ids=lambda b: b.name)
def test_routing_changed_and_put_back_inside_the_call_passes(backend):
    calls = _Counting.calls
    verdicts = CaseRun(SPEC, backend.name, backend).verify()
    assert next(v for v in verdicts if v.check == "process_state").figures == {"process_settings_compared": 15}
    assert isinstance(backend, PatchesAndRestores) or _Counting.calls > calls  # its modes did run
