"""LayerNormMLP in the TE lane (spec.te.module "layernorm_mlp"): TE's real LayerNormMLP over the tex emulation against
eager layer_norm, fc1, the activation, fc2, judged by the family's checks, with planted faults in the activation:
- a dsrelu 1% off at one element fails grad_parity naming fc1's parameter; a correct dsrelu written differently (in
  fp64, 2 relu(x) grad) passes it;
- an srelu whose output is a view into a buffer twice its size (an extra activation copy kept for fc2's wgrad) fails
  te_saved_bytes with the surplus bytes; the emulation as shipped keeps exactly the oracle's bytes and GEMMs.
"""

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

# One LayerNormMLP (hidden 32, ffn 64), everything trained, the input without grad; srelu reaches tex.srelu/dsrelu.
SPEC = CaseSpec("te_peft", (32, 64, 32), (False, False), (False, False), False, (16,),
                te=TEConfig(module="layernorm_mlp", activation="srelu"), iterations=1)


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


@pytest.fixture(scope="module")
def eager():
    return run_mean_reduced(SPEC, EagerBackend())


def _run():
    return run_mean_reduced(SPEC, TEEagerBackend(), default_probes("te_eager"))


def _dsrelu_off(original):
    def dsrelu(grad, x, quantizer):
        dx = original(grad, x, quantizer).clone()
        dx.view(-1)[int((x.reshape(-1) > 0).nonzero()[5])] *= 1.01  # one positive element of fc1's output, 1% off
        return dx
    return dsrelu


def _fp64_dsrelu(original):
    """dsrelu as 2 relu(x) grad in fp64: another precision for the same gradient."""
    def dsrelu(grad, x, quantizer):
        assert quantizer is None, "high precision only"
        return (2 * x.double().clamp_min(0) * grad.double()).to(x.dtype)
    return dsrelu


def test_layernorm_mlp_runs_the_oracles_gemms_and_saves_its_bytes(eager):
    got = _run()
    assert got.error is None, got.error
    verdicts = [grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC)), gemm_work(SPEC.id, "te_eager", SPEC, got),
                saved_bytes(SPEC.id, "te_eager", SPEC, got)]
    assert all(v.ok for v in verdicts), [v.message for v in verdicts]
    assert got.figures["saved_bytes_actual"] == required_saved(SPEC).nbytes > 0


def test_wrong_dsrelu_fails_grad_parity_naming_fc1(eager):
    with patched(loaded_tex(), "dsrelu", _dsrelu_off):
        got = _run()
    verdict = grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC))
    assert not verdict.ok and "0.weight" in verdict.message, verdict.message


def test_dsrelu_written_differently_passes(eager):
    with patched(loaded_tex(), "dsrelu", _fp64_dsrelu):
        got = _run()
    verdict = grad_parity(SPEC.id, "te_eager", eager, got, tolerance_for(SPEC))
    assert verdict.ok, verdict.message


def _padded_srelu(original):
    def srelu(x, quantizer):
        y = original(x, quantizer)
        kept = torch.empty(2 * y.numel(), dtype=y.dtype, device=y.device)
        kept[: y.numel()] = y.reshape(-1)
        return kept[: y.numel()].view(y.shape)  # a view of twice the bytes: its storage is what backward keeps
    return srelu


def test_an_extra_activation_copy_kept_for_backward_fails_saved_bytes():
    with patched(loaded_tex(), "srelu", _padded_srelu):
        got = _run()
    verdict = saved_bytes(SPEC.id, "te_eager", SPEC, got)
    need = required_saved(SPEC).nbytes
    assert not verdict.ok and f"vs {need:,} B" in verdict.message, verdict.message
    assert got.figures["saved_bytes_actual"] == need + 16 * 64 * 4, got.figures
