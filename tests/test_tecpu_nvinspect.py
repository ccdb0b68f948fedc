"""TE's debug features loaded by nvdlfw_inspect's DebugManager (by file path, outside the import system) are TE's
source like the rest: rewritten over the emulation (te_verify/te/tecpu/nvinspect.py). A file outside TE's package
loads as nvdlfw_inspect loads it; an unmeasured nvdlfw_inspect version is refused for TE's files."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import nvinspect
from te_verify.te.tecpu.strict import Unemulated

debug_manager = pytest.importorskip("nvdlfw_inspect.debug_manager")
registry = pytest.importorskip("nvdlfw_inspect.registry")


@pytest.fixture(scope="module")
def te_python() -> None:
    tecpu.boot()
    # TE's namespace API registers itself with nvdlfw_inspect when first imported; imported here, once, so that a
    # feature file loaded into a test's empty registry is deferred whatever ran before (alone or in any order).
    importlib.import_module("transformer_engine.debug.features.api")


@pytest.fixture
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """nvdlfw_inspect's global registry, empty for the test and restored after it."""
    monkeypatch.setattr(registry.Registry, "data", {})
    return registry.Registry.data


def _te_feature(name: str) -> str:
    return os.path.join(os.path.dirname(importlib.util.find_spec("transformer_engine").origin),
                        "debug", "features", name)


def _per_tensor_cast(data: dict):
    """per_tensor_scaling.py's module-level cast, from the feature class the file registered (deferred: TE's
    namespace API is not loaded in an empty registry)."""
    (feature,) = data["transformer_engine"].deferred_features
    return feature.modify_tensor.__globals__["per_tensor_cast"]


def test_te_feature_loaded_by_path_is_rewritten(te_python, empty_registry) -> None:
    debug_manager.import_and_exec_module(_te_feature("per_tensor_scaling.py"))
    cast = _per_tensor_cast(empty_registry)
    tex = __import__("transformer_engine_torch")
    out = cast(torch.full((4, 4), 2.0), tex.DType.kFloat8E4M3)  # its `assert tensor.is_cuda` holds (rule R2)
    assert torch.equal(out.dequantize(), torch.full((4, 4), 2.0)), "the cast feature computed another value"


def test_the_same_file_through_nvdlfw_inspects_own_loader_meets_cpu_torch(te_python, empty_registry) -> None:
    """The planted fault: without the compatibility step the feature's CUDA check fails on the emulated device."""
    original = debug_manager.import_and_exec_module.__wrapped__
    original(_te_feature("per_tensor_scaling.py"))
    cast = _per_tensor_cast(empty_registry)
    with pytest.raises(AssertionError, match="Must be a GPU tensor"):
        cast(torch.ones(4, 4), __import__("transformer_engine_torch").DType.kFloat8E4M3)


def test_a_file_outside_te_loads_unrewritten(te_python, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("TE_VERIFY_NVINSPECT_PROBE", str(seen))
    feature = tmp_path / "user_feature.py"
    feature.write_text("import os, torch\n"
                       "open(os.environ['TE_VERIFY_NVINSPECT_PROBE'], 'w').write(str(torch.ones(1).is_cuda))\n")
    debug_manager.import_and_exec_module(str(feature))
    assert seen.read_text() == "False", "a user's feature file was rewritten as TE's"


def test_an_unmeasured_nvdlfw_inspect_version_is_refused_for_te_files(te_python) -> None:
    te_root = os.path.dirname(importlib.util.find_spec("transformer_engine").origin)
    with pytest.raises(Unemulated, match=r"per_tensor_scaling.py loaded by nvdlfw_inspect 0\.3\.0"):
        nvinspect._load(_te_feature("per_tensor_scaling.py"), original=debug_manager.import_and_exec_module,
                        te_root=os.path.realpath(te_root), version="0.3.0")
