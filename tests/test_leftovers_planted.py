"""Planted faults for what a step leaves besides values (checks.leftovers): an output or gradient in another dtype,
a parameter left with another requires_grad, the caller's input or cotangent written, memory that grows step after
step, in the torch lane (CaseRun.verify) and the TE lane (verify_te_stack on TE's Python over the tex emulation).
Each is caught by its own check, naming the element; every other check of the case passes; clean runs pass."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import pytest
import torch

from planted_backends import (GradInOtherDtype, GrowingCache, OutputInOtherDtype, UnfreezesAfterForward, WritesCotangent,
                              WritesInput)
from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.checks.verdict import CheckFailures, Verdict
from te_verify.spec import CaseSpec, TEConfig
from te_verify.run.te_case import verify_te_stack

ALT = (True, False, True, False)
SPEC = CaseSpec("freeze", (32, 64, 128, 64, 32), ALT, ALT, True, (4, 6), "fp32", 1)
TE_SPEC = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, ALT, False, (16,), te=TEConfig(recipe="delayed"))
LEFTOVERS = {"output_meta", "grad_meta", "requires_grad_left", "inputs_left", "memory_retained"}


def failures(verify, case: CaseRun) -> dict[str, str]:
    """check -> message of every failed verdict of the case (none when it passed)."""
    try:
        verify(case)
    except CheckFailures as exc:
        return {v.check: v.message for v in exc.verdicts if not v.ok}
    return {}


def torch_lane(backend) -> dict[str, str]:
    return failures(CaseRun.verify, CaseRun(SPEC, backend.name, backend))


def te_lane(backend, spec: CaseSpec = TE_SPEC) -> dict[str, str]:
    return failures(verify_te_stack, CaseRun(spec, backend.name, backend))


def test_output_in_another_dtype_fails_output_meta_only():
    failed = torch_lane(OutputInOtherDtype())
    assert set(failed) == {"output_meta"}, failed  # the values, compared in fp64, are eager's
    assert "forward output (iteration 1): dtype torch.float64, expected torch.float32" in failed["output_meta"]


def test_gradient_in_another_dtype_fails_grad_meta_only():
    failed = torch_lane(GradInOtherDtype())
    assert set(failed) == {"grad_meta", "waste_peak"}, failed  # an fp64 gradient also takes twice the memory
    assert "grad of 1.weight after pass 1: dtype torch.float64, expected torch.float32" in failed["grad_meta"]
    assert "3.weight" not in failed["grad_meta"]


def test_parameter_left_with_another_requires_grad_fails_requires_grad_left():
    failed = torch_lane(UnfreezesAfterForward())
    # the next iteration then makes a gradient the first did not: grad_presence names it, and waste_flops the wgrad
    # GEMM computing it (the waste checks judge every iteration)
    assert set(failed) == {"requires_grad_left", "grad_presence", "waste_flops"}, failed
    assert failed["waste_flops"].startswith("iteration 2: ")
    assert "layer 0 (frozen weight): 1 wgrad GEMM, 0 required" in failed["waste_flops"]
    assert failed["requires_grad_left"].endswith("parameter 0.weight: requires_grad True after the run, expected False")
    assert "0.weight: has a gradient after iteration 2, expected None" in failed["grad_presence"]


def test_input_written_after_the_forward_fails_inputs_left_only():
    failed = torch_lane(WritesInput())
    assert set(failed) == {"inputs_left"}, failed
    assert "input x: written by the run (768 of 768 elements changed, max abs change" in failed["inputs_left"]
    assert "cotangent" not in failed["inputs_left"]


def test_cotangent_written_during_backward_fails_inputs_left_only():
    failed = torch_lane(WritesCotangent())
    assert set(failed) == {"inputs_left"}, failed
    assert "output cotangent: written by the run (" in failed["inputs_left"] and "input x" not in failed["inputs_left"]


def test_cache_growing_every_step_fails_memory_retained_naming_its_holder():
    failed = torch_lane(GrowingCache())
    assert set(failed) == {"memory_retained"}, failed
    # one output copy per step: 4 x 6 x 32 fp32 values
    assert "a training step after the measured one retained 3,072 B beyond the gradients (cpu_storage_tracker)" in \
        failed["memory_retained"]
    assert "held by the backend's callable (closure outputs)[1]" in failed["memory_retained"]


class CycleEachStep(EagerBackend):
    """Clean: each forward leaves a copy of its output in a reference cycle it drops, garbage that only a collection
    frees (reference counting never does)."""

    name = "clean_cycle_each_step"

    def prepare(self, model, spec):
        model = super().prepare(model, spec)

        def forward(x):
            out = model(x)
            cycle = {"copy": out.detach().clone()}
            cycle["self"] = cycle
            return out

        return forward


def test_garbage_cycle_each_step_passes_memory_retained_collected_among_the_case_own_objects(monkeypatch):
    """The settle loop's collections free the cycle while every object older than the measured step is frozen out of
    them (what keeps a collection's cost independent of a worker's age), and the run leaves nothing frozen."""
    collect, seen_frozen = gc.collect, []
    monkeypatch.setattr(gc, "collect", lambda *a: (seen_frozen.append(gc.get_freeze_count()), collect(*a))[1])
    gc.disable()  # no automatic collection may free the cycle first
    try:
        failed = torch_lane(CycleEachStep())
    finally:
        gc.enable()
    assert "memory_retained" not in failed and not failed, failed
    assert seen_frozen and min(seen_frozen) > 0, seen_frozen
    assert gc.get_freeze_count() == 0


def _leftovers(verdicts: list[Verdict]) -> dict[str, Verdict]:
    return {v.check: v for v in verdicts if v.check in LEFTOVERS}


@pytest.mark.parametrize("spec", [SPEC, SPEC.replace(warmup_steps=1, replays=2)], ids=["r1", "warmup1-r2"])
def test_clean_eager_passes_every_leftover_check(spec):
    checks = _leftovers(CaseRun(spec, "eager", EagerBackend()).verify())
    assert set(checks) == LEFTOVERS and all(v.ok for v in checks.values())
    assert checks["output_meta"].figures["output_meta_compared"] == spec.iterations + spec.warmup_steps
    assert checks["grad_meta"].figures["grad_meta_compared"] == 5 * spec.replays  # layers 1 and 3, the input
    assert checks["inputs_left"].figures["inputs_compared"] == 2 * spec.iterations  # every iteration's batch
    assert checks["memory_retained"].figures["retained_bytes"] == 0


@pytest.mark.parametrize("recipe", [None, "delayed"])
def test_clean_te_build_passes_every_leftover_check(te_python, recipe):
    """TE returns the activation dtype (fp32 here) whatever the recipe: eager's output dtype is the rule."""
    case = CaseRun(TE_SPEC.replace(te=TEConfig(recipe=recipe)), "te_eager", TEEagerBackend())
    assert not set(failures(verify_te_stack, case)) & LEFTOVERS
    checks = _leftovers(case.verdicts)
    assert set(checks) == LEFTOVERS and case.figures["retained_bytes"] == 0


class TEOutputInOtherDtype(TEEagerBackend):
    """TE's modules with the output upcast to fp64 (the values TE computed)."""

    name = "te_eager"  # under te_eager's probes

    def prepare(self, model, spec):
        fn = super().prepare(model, spec)
        return lambda x: fn(x).double()


def test_te_output_in_another_dtype_fails_output_meta(te_python):
    clean = te_lane(TEEagerBackend())  # a recorded gap of TE's (fp8_copies) fails beside it either way
    failed = te_lane(TEOutputInOtherDtype())
    assert set(failed) == set(clean) | {"output_meta"}, failed
    assert "forward output (iteration 1): dtype torch.float64, expected torch.float32" in failed["output_meta"]


KEPT: list[torch.Tensor] = []  # the planted TE build's process-wide cache


@contextlib.contextmanager
def te_build_keeping_every_wgrad() -> Iterator[None]:
    """TE's own Linear whose backward keeps a copy of every weight gradient in a module-level list: memory a TE
    build keeps growing step after step, held outside the model."""
    te_api.active().api  # boots the tex emulation before TE is imported
    from transformer_engine.pytorch.module import linear

    original = linear._linear_backward_impl

    def planted(args):
        wgrad, dgrad, bgrad = original(args)
        if wgrad is not None:
            KEPT.append(wgrad.clone())
        return wgrad, dgrad, bgrad

    linear._linear_backward_impl = planted
    try:
        yield
    finally:
        linear._linear_backward_impl = original
        KEPT.clear()


def test_te_build_growing_every_step_fails_memory_retained(te_python):
    clean = te_lane(TEEagerBackend())
    with te_build_keeping_every_wgrad():
        failed = te_lane(TEEagerBackend())
    assert set(failed) == set(clean) | {"memory_retained"}, failed
    # a copy of each trainable weight's wgrad a step: 128 x 64 and 32 x 64 fp32
    assert "a training step after the measured one retained 40,960 B beyond the gradients" in failed["memory_retained"]
    assert "held outside the model and the callable under test (a process-wide cache?)" in failed["memory_retained"]
