"""TEGemmProbe against a stand-in for TE's cpp_extensions.gemm (real TE needs CUDA): roles from the layout, FLOPs
from the shapes, the module that imported the name by value is patched too, and everything is restored on exit."""
import sys
import types

import pytest
import torch

from te_verify import te_api
from te_verify.probes.te_gemm import TEGemmProbe, gemm_dims


def _fake_gemm_module() -> types.ModuleType:
    """general_gemm / general_grouped_gemm with TE's parameter names and defaults; the grouped one loops over
    general_gemm through its module globals, as TE's fallback path does."""
    gemm = types.ModuleType("fake_te.cpp_extensions.gemm")

    def general_gemm(A, B, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None, alpha=1.0,
                     beta=None, accumulate=False, layout="TN", out=None, bias=None, use_split_accumulator=False,
                     grad=False, ub=None, ub_type=None, extra_output=None, bulk_overlap=False):
        a = A.t() if layout[0] == "T" else A
        b = B.t() if layout[1] == "T" else B
        return b @ a, None, None, None

    def general_grouped_gemm(A, B, out, quantization_params, out_dtype, layout="TN", m_splits=None, gelu=False,
                             grad=False, accumulate=False, bias=None, use_bias=False, use_split_accumulator=False,
                             D_dtype=None, single_output=False):
        outs = [gemm.general_gemm(a, b, layout=layout, grad=grad)[0] for a, b in zip(A, B)]
        return outs, None, None

    gemm.general_gemm, gemm.general_grouped_gemm = general_gemm, general_grouped_gemm
    return gemm


def _fake_linear_module(gemm: types.ModuleType) -> types.ModuleType:
    """module/linear.py's pattern: `from ..cpp_extensions import general_gemm`, looked up at call time."""
    linear = types.ModuleType("fake_te.module.linear")
    linear.general_gemm = gemm.general_gemm
    code = ('def step(w, x, dy):\n'
            '    y, *_ = general_gemm(w, x)\n'
            '    dx, *_ = general_gemm(w, dy, layout="NN", grad=True)\n'
            '    dw, *_ = general_gemm(x, dy, layout="NT", grad=True)\n'
            '    return y, dx, dw\n')
    exec(code, linear.__dict__)
    return linear


@pytest.fixture
def fake_te(monkeypatch):
    gemm = _fake_gemm_module()
    linear = _fake_linear_module(gemm)
    monkeypatch.setitem(sys.modules, gemm.__name__, gemm)
    monkeypatch.setitem(sys.modules, linear.__name__, linear)
    return gemm, linear


def test_roles_phases_and_flops_are_attributed(fake_te):
    gemm, linear = fake_te
    w, x, dy = torch.randn(64, 32), torch.randn(16, 32), torch.randn(16, 64)
    with TEGemmProbe(source=gemm) as probe:
        probe.phase("forward")
        y, _, _ = linear.step(w, x, dy)
        probe.phase("backward", 1)
        _, dx, dw = linear.step(w, x, dy)
    assert (y.shape, dx.shape, dw.shape) == ((16, 64), (16, 32), (64, 32))
    assert [(e.pass_index, e.role) for e in probe.events] == [(0, "fprop"), (0, "dgrad"), (0, "wgrad"),
                                                              (1, "fprop"), (1, "dgrad"), (1, "wgrad")]
    assert {(e.m, e.n, e.k) for e in probe.events} == {(16, 64, 32), (16, 32, 64), (64, 32, 16)}
    figures = probe.figures()
    assert figures["te_gemm_flops"] == 6 * 2 * 16 * 32 * 64
    assert figures["te_gemms_by_pass_role"]["1.wgrad"] == 1 and figures["te_gemm_count"] == 6


def test_grouped_gemm_counts_each_group_once(fake_te):
    gemm, _ = fake_te
    a, b = [torch.randn(64, 32)] * 3, [torch.randn(8, 32)] * 3
    with TEGemmProbe(source=gemm) as probe:
        gemm.general_grouped_gemm(a, b, [None] * 3, [None] * 3, torch.float32, m_splits=[8, 8, 8])
    assert [(e.op, e.role, e.m, e.n, e.k) for e in probe.events] == [("general_grouped_gemm", "fprop", 8, 64, 32)] * 3


def test_patch_is_undone_on_exit_even_after_a_raise(fake_te):
    gemm, linear = fake_te
    originals = (gemm.general_gemm, gemm.general_grouped_gemm, linear.general_gemm)
    with pytest.raises(RuntimeError):
        with TEGemmProbe(source=gemm):
            assert linear.general_gemm is not originals[2]
            raise RuntimeError("backend failed")
    assert (gemm.general_gemm, gemm.general_grouped_gemm, linear.general_gemm) == originals


def test_inactive_without_real_transformer_engine():
    with te_api.using(te_api.resolve("reference")):
        with TEGemmProbe() as probe:
            pass
    assert probe.figures() == {"te_gemm_probe": "inactive: --te-impl reference: not real transformer_engine"}


@pytest.mark.parametrize("layout, dims", [("TN", (16, 64, 32)), ("NN", (16, 32, 64)), ("NT", (64, 32, 16))])
def test_gemm_dims_follow_te_layouts(layout, dims):
    shapes = {"TN": ((64, 32), (2, 8, 32)), "NN": ((64, 32), (16, 64)), "NT": ((16, 32), (16, 64))}[layout]
    assert gemm_dims(torch.empty(shapes[0]), torch.empty(shapes[1]), layout) == dims
