"""The opt-in triton mode (te_verify/te/tecpu/real_triton.py): TE's triton kernels stubbed by default, served as
TE's real source in "interpret" mode only when triton's interpreter can run them, and every other request a
one-line error naming the variable."""
from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import pytest

from te_verify.te.tecpu import real_triton, rewrite


@pytest.fixture(autouse=True)
def restore_mode():
    """Each test leaves the process's triton mode as it found it (the boot's choice)."""
    mode, version, compat = list(real_triton._MODE), list(real_triton._VERSION), list(real_triton._COMPAT)
    yield
    real_triton._MODE[:], real_triton._VERSION[:], real_triton._COMPAT[:] = mode, version, compat


def test_default_is_the_stubs() -> None:
    for text in (None, "", "stub"):
        real_triton.configure(text)
        assert real_triton.stubbed(), f"{text!r} did not choose the stubs"
    assert "stubbed" in real_triton.describe()


@pytest.mark.parametrize("text", ["interpreter", "real", "1"])
def test_unknown_mode_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(real_triton.TritonModeError) as info:
        real_triton.configure(text)
    message = str(info.value)
    assert "\n" not in message and real_triton.TRITON_ENV in message and repr(text) in message, message
    assert real_triton.stubbed(), "a refused mode changed the mode"


def test_interpret_needs_the_interpreter_switch(monkeypatch) -> None:
    """Without TRITON_INTERPRET=1 triton would look for a GPU at the first launch: refused at boot instead."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.9.0"))
    with pytest.raises(real_triton.TritonModeError, match="TRITON_INTERPRET=1"):
        real_triton.configure("interpret")
    assert real_triton.stubbed()


def test_interpret_needs_triton_importable(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "triton", None)  # an import of it raises ImportError
    with pytest.raises(real_triton.TritonModeError, match="triton is not importable.*--target"):
        real_triton.configure("interpret")
    assert real_triton.stubbed()


def test_interpret_names_the_triton_it_runs(monkeypatch) -> None:
    """The mode chosen, the CPU driver offered (test_cpu_driver_only_where_no_driver_is_active), the version named."""
    activated = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.9.0"))
    monkeypatch.setattr(real_triton, "_activate_cpu_driver", lambda: activated.append(True))
    monkeypatch.setattr(real_triton.triton_interpreter_compat, "apply", lambda version: f"step for {version}")
    real_triton.configure("interpret")
    assert not real_triton.stubbed() and activated == [True]
    assert "step for 3.9.0" in real_triton.describe(), "the interpreter's compatibility step is not in the header"
    assert "triton 3.9.0's interpreter" in real_triton.describe(), real_triton.describe()


def test_finder_serves_te_triton_source_only_when_not_stubbing() -> None:
    """With the stubs off, TE's triton modules load from TE's own files through the rewriting loader (their
    torch.cuda touch points rewritten like every TE module's); with them on, the strict stub."""
    name = "transformer_engine.pytorch.triton.cross_entropy"
    package = importlib.machinery.PathFinder.find_spec("transformer_engine").submodule_search_locations[0]
    path = [os.path.join(package, "pytorch", "triton")]  # the parent package's __path__, as the import system gives
    real = rewrite.TEFinder(types.SimpleNamespace(), rewrite.RewriteLog(), {}, stub_triton=False).find_spec(name, path)
    stub = rewrite.TEFinder(types.SimpleNamespace(), rewrite.RewriteLog(), {}).find_spec(name, path)
    assert isinstance(real.loader, rewrite.RewritingLoader), f"not TE's source: {real.loader}"
    assert real.origin.endswith("transformer_engine/pytorch/triton/cross_entropy.py"), real.origin
    assert isinstance(stub.loader, rewrite.StubLoader), f"the default must stub: {stub.loader}"


def test_autotuner_benchmark_runs_nothing_and_ties_every_config() -> None:
    """The CPU driver's benchmarker never runs the kernel (an autotuned kernel that writes into its input would run
    once per config) and times every config alike, so the autotuner keeps its first."""
    calls = []
    timings = [real_triton.CpuDriver().get_benchmarker()(lambda: calls.append(1), quantiles=(0.5, 0.2, 0.8))
               for _ in range(3)]
    assert calls == [], "the benchmark ran the kernel"
    assert timings == [[0.0, 0.0, 0.0]] * 3, timings
    assert min(range(3), key=lambda i: timings[i]) == 0


def test_cpu_driver_serves_nothing_else() -> None:
    with pytest.raises(RuntimeError, match="not 'get_current_target'"):
        real_triton.CpuDriver().get_current_target()


@pytest.mark.parametrize("gpu_driver_active", [False, True])
def test_cpu_driver_only_where_no_driver_is_active(monkeypatch, gpu_driver_active: bool) -> None:
    """No active driver (this machine): the CPU one becomes active. A GPU machine's own driver is kept."""
    chosen = []
    backend = types.SimpleNamespace(driver=types.SimpleNamespace(is_active=lambda: gpu_driver_active))
    monkeypatch.setitem(sys.modules, "triton.backends", types.SimpleNamespace(backends={"nvidia": backend}))
    monkeypatch.setitem(sys.modules, "triton.runtime.driver",
                        types.SimpleNamespace(driver=types.SimpleNamespace(set_active=chosen.append)))
    real_triton._activate_cpu_driver()
    assert [type(d) for d in chosen] == ([] if gpu_driver_active else [real_triton.CpuDriver]), chosen


def test_cpu_driver_answers_device_zero_and_its_shared_memory_only() -> None:
    """TE's mHC config pruner reads the device's shared memory through the driver: the emulated GPU's is served,
    another device or property raises, naming it."""
    driver = real_triton.CpuDriver()
    assert driver.get_current_device() == 0
    assert driver.utils.get_device_properties(0)["max_shared_mem"] == 232448
    with pytest.raises(KeyError, match="'multiprocessor_count' is not emulated"):
        driver.utils.get_device_properties(0)["multiprocessor_count"]
    with pytest.raises(RuntimeError, match="not 1"):
        driver.utils.get_device_properties(1)
    with pytest.raises(RuntimeError, match="not 'launch'"):
        driver.utils.launch
