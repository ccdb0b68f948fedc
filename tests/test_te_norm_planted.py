"""LayerNormLinear in the TE lane (spec.te.module "layernorm_linear"): TE's real LayerNormLinear over the tex
emulation against eager layer_norm + linear, judged by the family's checks, with planted faults in the norm:
- a layernorm_bwd whose dgamma is wrong at one element fails grad_parity naming the norm's scale; a correct
  layernorm_bwd written differently (the sums in fp64, another order) passes it;
- a layernorm_fwd whose 1/sigma is a view into a buffer twice its size (an extra copy kept for backward) fails
  te_saved_bytes with the surplus bytes; the emulation as shipped keeps exactly the oracle's bytes.
"""
import sys

import pytest
import torch

from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.parity import grad_parity
from te_verify.checks.te_waste import gemm_work, saved_bytes
from te_verify.checks.tolerances import tolerance_for
from te_verify.oracle.required import required_saved
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec, TEConfig
from planting import loaded_tex, patched

# Everything trained, the input without grad: layer 0's trained norm needs its dgrad GEMM and norm backward.
SPEC = CaseSpec("te_peft", (32, 64, 32), (False, False), (False, False), False, (16,),
                te=TEConfig(module="layernorm_linear"), iterations=1)


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


@pytest.fixture(scope="module")
def eager():
    return run_mean_reduced(SPEC, EagerBackend())


def _run():
    return run_mean_reduced(SPEC, TEEagerBackend(), default_probes("te_eager"))


def _dgamma_off(original):
    def layernorm_bwd(*args):
        dx, dgamma, dbeta = original(*args)
        dgamma = dgamma.clone()
        dgamma[3] *= 1.01  # one element of one layer's scale gradient, 1% off
        return [dx, dgamma, dbeta]
    return layernorm_bwd


def _fp64_bwd(original):
    """layernorm_bwd from the sums in fp64 (dx = rsigma / n * (n dy - sum(dy) - xhat sum(dy xhat))): another order and
    precision for the same gradients."""
    def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
        n = x.shape[-1]
        xhat = (x.double() - mu.double()[:, None]) * rsigma.double()[:, None]
        dy = dz.double() * (gamma.double() + (1 if zero_centered_gamma else 0))
        dx = rsigma.double()[:, None] / n * (n * dy - dy.sum(-1, keepdim=True) - xhat * (dy * xhat).sum(-1, keepdim=True))
        return [dx.to(x.dtype), (dz.double() * xhat).sum(0).to(gamma.dtype), dz.double().sum(0).to(gamma.dtype)]
    return layernorm_bwd


def test_layernorm_linear_runs_the_oracles_gemms_and_saves_its_bytes(eager):
    got = _run()
    assert got.error is None, got.error
    verdicts = [grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC)), saved_bytes(SPEC.id, "te_eager", SPEC, got)]
    assert all(v.ok for v in verdicts), [v.message for v in verdicts]
    assert got.figures["saved_bytes_actual"] == required_saved(SPEC).nbytes > 0


def test_wrong_dgamma_fails_grad_parity_naming_the_norm_scale(eager):
    with patched(loaded_tex(), "layernorm_bwd", _dgamma_off):
        got = _run()
    verdict = grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC))
    assert not verdict.ok and "norm.weight" in verdict.message, verdict.message


def test_layernorm_bwd_written_differently_passes(eager):
    with patched(loaded_tex(), "layernorm_bwd", _fp64_bwd):
        got = _run()
    verdict = grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC))
    assert verdict.ok, verdict.message


def _padded_rsigma(original):
    def layernorm_fwd(*args):
        out, mu, rsigma = original(*args)
        kept = torch.empty(2 * rsigma.numel(), dtype=rsigma.dtype, device=rsigma.device)
        kept[: rsigma.numel()] = rsigma
        return [out, mu, kept[: rsigma.numel()]]  # a view of twice the bytes: its storage is what backward keeps
    return layernorm_fwd


def test_an_extra_copy_kept_for_backward_fails_saved_bytes():
    # TE's module/_common.py calls layernorm_fwd through cpp_extensions, which bound tex's names at import.
    loaded_tex()
    with patched(sys.modules["transformer_engine.pytorch.cpp_extensions"], "layernorm_fwd", _padded_rsigma):
        got = _run()
    verdict = saved_bytes(SPEC.id, "te_eager", SPEC, got)
    need = required_saved(SPEC).nbytes
    assert not verdict.ok and f"vs {need:,} B" in verdict.message, verdict.message
    assert got.figures["saved_bytes_actual"] > need, got.figures
