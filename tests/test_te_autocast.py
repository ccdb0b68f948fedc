"""TE's Linear under torch.autocast(bf16) over fp32 parameters (TE's real Python over the tex emulation, which reads
the CPU's autocast as CUDA's: tecpu rule R10): its GEMMs, read at the tex boundary through TE's aten casts, are
exactly the required ones in bf16; it keeps the bf16 cast of a trainable weight whose dgrad is not needed (TE 2.20
linear.py:739 `wt_save = weightmat`, the AMP cast of :589), which te_saved_bytes names; where every kept copy feeds a
dgrad the same checks pass. Recorded in expectations/te_eager.toml."""
import pytest
import torch

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_waste import gemm_work, saved_bytes
from te_verify.matrix.autocast import te_autocast_specs
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced
from te_verify.te import api as te_api

FIRST_TRAINED_NO_DGRAD, EVERY_COPY_FEEDS_DGRAD = [s for s in te_autocast_specs("pr") if s.te.recipe is None]


pytestmark = pytest.mark.usefixtures("te_python")  # TE's Python over the emulation (tests/conftest.py)


def _verdicts(spec):
    got = run_mean_reduced(spec, TEEagerBackend(), default_probes("te_eager", True))
    assert got.error is None, got.error
    return gemm_work(spec.id, "te_eager", spec, got), saved_bytes(spec.id, "te_eager", spec, got)


def test_a_kept_cast_of_a_weight_without_dgrad_is_named():
    work, saved = _verdicts(FIRST_TRAINED_NO_DGRAD)
    assert work.ok, work.message
    assert not saved.ok
    assert "layer 1 (dgrad not needed): saved a torch.bfloat16 copy of its weight [128, 64] 16,384 B, 0 required" \
        in saved.message


def test_every_kept_cast_feeding_a_dgrad_passes():
    work, saved = _verdicts(EVERY_COPY_FEEDS_DGRAD)
    assert work.ok and saved.ok, work.message + saved.message
    assert saved.figures["saved_bytes_actual"] == saved.figures["saved_bytes_required"] > 0


def _layer_step(impl, recipe: str) -> list:
    """One TE Linear (fp32 parameters, bias) under torch.autocast(bf16) with `recipe` on `impl`: the output and the
    input, weight and bias gradients."""
    torch.manual_seed(0)
    x, weight, bias = torch.randn(16, 64), torch.randn(128, 64) * 0.1, torch.randn(128) * 0.1
    grad = torch.randn(16, 128)
    with te_api.using(impl):
        linear = impl.api.Linear(64, 128, bias=True, params_dtype=torch.float32, device="cpu")
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        x.requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16), impl.api.autocast(enabled=True, recipe=getattr(impl.api, recipe)()):
            y = linear(x)
        y.backward(grad.to(y.dtype))
    return [y.detach(), x.grad, linear.weight.grad, linear.bias.grad]


@pytest.mark.parametrize("recipe", ("DelayedScaling", "Float8CurrentScaling"))
def test_fp8_under_autocast_te_and_its_reference_agree_bit_for_bit(recipe):
    """TE quantizes the fp32 operands, emits bf16 from every GEMM (wgrad too) and adds the bias before the one
    rounding; the tex emulation's GEMM runs outside the caller's autocast (before, it multiplied in bf16 and rounded
    the output twice: 0.27% normwise off the reference), and the reference's wgrad is emitted in bf16 (before: fp32).
    Current scaling: the reference's scale is TE's one fp32 division and its FP8 GEMM scales the sum of FP8 products
    (before: a reciprocal times 448, and operands dequantized first; the last bits flipped bf16 roundings)."""
    got, want = _layer_step(te_api.active(), recipe), _layer_step(te_api.quantized_reference(), recipe)
    for name, g, w in zip(("output", "input grad", "weight grad", "bias grad"), got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), name
