"""What te_verify.run.isolation cuts between cases, each shown by a case whose result depended on what ran before it.

- inductor's AOTAutograd cache: a warm-up replay, then the plain replay of the same graph, in one process with an
  empty cache dir. With the cache on, the second case loaded the first's backward, compiled with donated buffers at
  the warm-up's plain backward, and raised at its first backward(retain_graph=True) (alone it completes both).
- TE's global FP8 state: a delayed-scaling case leaves its modules' amax, history and scale tensors in TE's global
  buffers; without the reset the next case's step reduces over every earlier case's (8, 16, 24 entries after one,
  two, three cases).
- the global RNG: seeded from the case.
- TE 2.14.0's FP8 state sits on FP8GlobalStateManager itself, beside classmethods named like the newer state's fields
  (fp8_graph_capturing(), is_first_fp8_module()): the snapshot and restore read and write the data attributes.
"""
from __future__ import annotations

import sys

import pytest
import torch

from te_verify.te import api as te_api
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.backends.torch_compile import TorchCompileBackend
from te_verify.run.isolation import fp8_autocast_state, fresh_case, set_fp8_autocast_state
from te_verify.matrix.stacks import FAMILIES
from te_verify.matrix.te import FAMILIES as TE_FAMILIES
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.runner import run_case

REPLAYED = "lin4-w32.32.32.32.32-freeze0000-bias-x_grad-in8-fp32-r2"


@pytest.mark.system
def test_an_inductor_backward_is_not_loaded_from_an_earlier_case(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # empty: only this test's entries
    specs = {s.id: s for s in FAMILIES["replay"]("nightly")}
    backend = TorchCompileBackend("inductor")
    run_case(specs[f"{REPLAYED}-wu1"], backend)  # compiles its backward at the warm-up's plain backward
    replayed = run_case(specs[REPLAYED], backend)
    assert replayed.error is None and len(replayed.grads) == 2, f"{REPLAYED} after its warm-up twin: {replayed.error}"


def _global_fp8_entries() -> int:
    state = sys.modules["transformer_engine.pytorch.quantization"].FP8GlobalStateManager.quantization_state
    return sum(len(entries) for entries in state.global_amax_buffer.values())


@pytest.mark.skipif(not te_api.te_installed(), reason="transformer_engine is not installed")
def test_te_global_fp8_state_is_the_case_own():
    first, second = [s for s in TE_FAMILIES["te_fp8"]("pr") if s.te.recipe == "delayed"][:2]
    with te_api.using(te_api.resolve(te_api.CPU_CHOICE)):
        run_mean_reduced(first, TEEagerBackend())
        alone = _global_fp8_entries()
        run_mean_reduced(second, TEEagerBackend())
        run_mean_reduced(first, TEEagerBackend())
        assert alone > 0 and _global_fp8_entries() == alone, f"{first.id}: TE's global amax buffer holds " \
            f"{_global_fp8_entries()} entries after {second.id}, {alone} alone"


def test_the_global_rng_is_seeded_from_the_case():
    spec = FAMILIES["replay"]("nightly")[0]
    fresh_case(spec)
    alone = torch.rand(4)
    torch.rand(7)  # what another case drew
    fresh_case(spec)
    assert torch.equal(torch.rand(4), alone)


class _TE214Manager:
    """TE 2.14.0's FP8GlobalStateManager in shape (quantization.py): state as class attributes, read by classmethods."""

    FP8_ENABLED = False
    FP8_GRAPH_CAPTURING = False
    IS_FIRST_FP8_MODULE = False

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        return cls.FP8_GRAPH_CAPTURING

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        return cls.IS_FIRST_FP8_MODULE


def test_te_2_14_fp8_state_is_read_and_restored_without_overwriting_its_methods(monkeypatch):
    module = type(sys)("transformer_engine.pytorch.quantization")
    module.FP8GlobalStateManager = _TE214Manager
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.quantization", module)
    monkeypatch.setattr(_TE214Manager, "FP8_GRAPH_CAPTURING", True)
    state = fp8_autocast_state()
    assert state["TE graph capturing"] is True and state["TE first FP8 module"] is False, state
    set_fp8_autocast_state({})  # back to the values outside any autocast region
    assert isinstance(_TE214Manager.__dict__["fp8_graph_capturing"], classmethod), "fp8_graph_capturing overwritten"
    assert _TE214Manager.fp8_graph_capturing() is False and _TE214Manager.is_first_fp8_module() is False
