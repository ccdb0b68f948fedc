"""The tex record against TE 2.20.2's C++ extension API (the same recorder wraps TE's real extension on a GPU):
every GEMM or quantize entry point of the extension is measured, noted as unmeasured, or not a GEMM; calls
with pybind's keyword names are recorded; an unmeasured GEMM path fails the GEMM check naming it."""
from __future__ import annotations

import json
import sys
import types
from importlib import resources

import pytest
import torch

from te_verify.checks.te_waste import gemm_work
from te_verify.matrix.te import peft_specs
from te_verify.record import Record
from te_verify.te.tecpu import record as tex_record
from te_verify.te.tecpu.record import TEX_MODULE, TexRecorder

MEASURED = {"generic_gemm", "te_general_grouped_gemm", "quantize", "split_quantize", "bgrad_quantize", "dequantize"}
# Entry points that run no GEMM and make no quantized copy a GEMM reads, or serve recipes outside the matrix.
NOT_GEMM = {"group_dequantize", "create_empty_quantized_tensor", "get_grouped_gemm_setup_workspace_size",
            "swizzle_scales_for_gemm_", "grouped_swizzle_for_gemm", "multi_tensor_swizzle_scales_for_gemm_",
            "multi_tensor_swizzle_scales_for_gemm_unchecked_", "multi_tensor_quantize",  # MXFP8/NVFP4 scale layouts
            "nvfp4_quantize_with_amax", "nvfp4_group_quantize_with_amax"}  # NVFP4 fused grouped MLP (unemulated)


def surface_functions(version: str) -> set[str]:
    text = resources.files("te_verify.te.tecpu").joinpath(f"surfaces/tex_{version}.json").read_text()
    return set(json.loads(text)["functions"])


def test_every_gemm_and_quantize_entry_point_of_te_2_20_is_accounted_for():
    functions = surface_functions("2.20.2")
    relevant = {f for f in functions if "gemm" in f or "quantize" in f}
    accounted = MEASURED | set(tex_record.UNMEASURED) | NOT_GEMM
    assert relevant - accounted == set(), "tex entry points the record neither measures nor notes"
    assert accounted - functions == set(), "names that are not TE 2.20.2 tex functions"


@pytest.fixture
def fake_tex(monkeypatch) -> types.SimpleNamespace:
    """A stand-in tex module whose entry points return plain values, installed where TE's Python finds it."""
    calls: list[str] = []

    def entry(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            return [None, None, None, None] if name == "generic_gemm" else [torch.zeros(1), kwargs.get("input")]
        return call

    module = types.ModuleType(TEX_MODULE)
    for name in ("generic_gemm", "bgrad_quantize", *tex_record.UNMEASURED):
        setattr(module, name, entry(name))
    monkeypatch.setitem(sys.modules, TEX_MODULE, module)
    return types.SimpleNamespace(module=module, calls=calls)


def test_calls_with_pybinds_keyword_names_are_recorded(fake_tex):
    a, b = torch.ones(8, 16), torch.ones(4, 16)
    kwargs = dict(zip(tex_record.GEMM_ARGS, [a, True, b, False, None, None, None, None, None, False, None, False,
                                              None, 0, False, False]))
    with TexRecorder() as recorder:
        fake_tex.module.generic_gemm(**kwargs, alpha=1.0, beta=None)
        fake_tex.module.bgrad_quantize(input=b, quantizer=None)
    (gemm,) = recorder.record.gemms
    assert (gemm.layout, gemm.m, gemm.n, gemm.k) == ("TN", 4, 8, 16)
    assert fake_tex.calls == ["generic_gemm", "bgrad_quantize"]


def test_an_unmeasured_gemm_path_fails_the_gemm_check_naming_it(fake_tex):
    with TexRecorder() as recorder:
        fake_tex.module.te_general_grouped_gemm_for_grouped_tensor()
        fake_tex.module.group_quantize()
    assert recorder.record.unmeasured == ["te_general_grouped_gemm_for_grouped_tensor", "group_quantize"]
    spec = peft_specs("smoke")[0]
    got = Record(backend="te_eager", observations={"gemm_log": [], "tex_record": recorder.record})
    verdict = gemm_work(spec.id, "te_eager", spec, got)
    assert not verdict.ok
    assert ("TE called tex.group_quantize, tex.te_general_grouped_gemm_for_grouped_tensor, whose GEMMs the tex "
            "record does not measure") in verdict.message
