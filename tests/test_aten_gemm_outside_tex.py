"""probes.tex_gemm.AtenGemmOutsideTex, which gives the LoRA family's torch sites their aten GEMMs beside TE's: an aten
GEMM the tex layer runs inside any of its calls (the emulated NVFP4 quantize's random Hadamard transform, a kernel's
work on a GPU) is no site's, and TE's process-wide NVFP4 Hadamard matrix (built once per process with an aten GEMM)
is counted apart, so a verdict does not depend on which case of a process built it first. A torch GEMM outside them,
constants or not, is still recorded."""
from __future__ import annotations

import pytest
import torch

from te_verify.probes.tex_gemm import AtenGemmOutsideTex
from te_verify.te import tecpu


@pytest.fixture(scope="module")
def nvfp4_tensor():
    tecpu.boot()
    from transformer_engine.pytorch.tensor import nvfp4_tensor

    return nvfp4_tensor


def _probe() -> AtenGemmOutsideTex:
    probe = AtenGemmOutsideTex()
    probe.bind(torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False)))
    return probe


def _torch_gemm() -> None:
    torch.ones(16, 16) @ torch.eye(16)  # constants, no site's: still an aten GEMM outside tex


def test_a_quantizes_hadamard_transform_is_left_out_and_a_torch_gemm_is_recorded(nvfp4_tensor):
    quantizer = nvfp4_tensor.NVFP4Quantizer(rowwise=True, columnwise=True, with_rht=True, with_post_rht_amax=True)
    x = torch.randn(32, 64).to(torch.bfloat16)
    with _probe() as probe:
        copy = quantizer(x)  # tex.quantize: the columnwise copy is the RHT of x^T, an aten GEMM in the emulation
        _torch_gemm()
    assert copy._columnwise_data is not None and copy._amax_columnwise is not None  # the RHT ran
    assert [(e.op, e.shape) for e in probe.events] == [("aten.mm.default", (16, 16))]
    assert probe.figures() == {"aten_gemm_count_outside_tex": 1, "aten_gemms_te_constants": 0}


def test_tes_process_wide_hadamard_matrix_is_counted_apart_once(nvfp4_tensor):
    nvfp4_tensor.get_rht_matrix.cache_clear()  # as in a process whose first NVFP4 quantizer this is
    with _probe() as probe:
        first = nvfp4_tensor.NVFP4Quantizer()
        nvfp4_tensor.NVFP4Quantizer()  # the cached matrix: no GEMM
        _torch_gemm()
    assert first.rht_matrix.shape == (16, 16)
    assert [(e.op, e.shape) for e in probe.events] == [("aten.mm.default", (16, 16))]
    assert probe.figures()["aten_gemms_te_constants"] == 1
    assert nvfp4_tensor.get_rht_matrix.cache_info().currsize == 1  # the builder put back, its cache kept


def test_the_probe_puts_back_what_it_wrapped(nvfp4_tensor):
    import transformer_engine_torch as tex

    before = (tex.quantize, tex.generic_gemm, nvfp4_tensor.get_rht_matrix)
    with _probe():
        assert tex.quantize is not before[0] and nvfp4_tensor.get_rht_matrix is not before[2]
    assert (tex.quantize, tex.generic_gemm, nvfp4_tensor.get_rht_matrix) == before
