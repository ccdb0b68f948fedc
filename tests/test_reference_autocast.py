"""te_verify.te.reference under torch.autocast(bf16) over fp32 parameters computes as TE's modules do: the input and
weight cast to bf16, the output in bf16, and the casts are what backward keeps (input iff wgrad, weight iff dgrad).
Before, it computed and returned fp32 and kept no cast, so the te_autocast family failed output_meta and
te_saved_bytes with the reference as a user's --te-impl."""
import pytest
import torch

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_waste import gemm_work, saved_bytes
from te_verify.matrix.autocast import te_autocast_specs
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced
from te_verify.te import api as te_api
from te_verify.te.reference import GroupedLinear, Linear


@pytest.fixture(autouse=True, scope="module")
def reference():
    with te_api.using(te_api.resolve("reference")) as impl:
        yield impl


@pytest.mark.parametrize("module", [Linear(8, 4), GroupedLinear(2, 8, 4)], ids=["linear", "grouped_linear"])
def test_outputs_and_gradients_in_the_autocast_s_and_the_parameters_dtypes(module):
    x = torch.randn(6, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x) if isinstance(module, Linear) else module(x, [2, 4])
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in module.parameters())


@pytest.mark.parametrize("spec", te_autocast_specs("pr"), ids=lambda s: s.id)
def test_the_pr_te_autocast_cases_do_the_required_work_and_keep_the_required_casts(spec):
    got = run_mean_reduced(spec, TEEagerBackend(), default_probes("te_eager", True))
    assert got.error is None, got.error
    work, saved = gemm_work(spec.id, "te_eager", spec, got), saved_bytes(spec.id, "te_eager", spec, got)
    assert work.ok and saved.ok, work.message + saved.message
    assert saved.figures["saved_bytes_actual"] == saved.figures["saved_bytes_required"] > 0


def test_fp8_under_autocast_emits_the_weight_gradient_in_the_autocast_s_dtype_as_te_does():
    """TE's wgrad GEMM emits the activation dtype unless it accumulates into main_grad (linear.py `wgrad_gemm_kwargs`
    out_dtype): under autocast with an FP8 recipe every element of a weight gradient is a bf16 value (TE 2.20.2 over
    the tex emulation: its dW equals the reference's rounded to bf16, bit for bit); outside autocast it is fp32's. The
    reference before 2026-11-29 kept the fp32 sum under autocast and fails the first assert."""
    from te_verify.te.reference import DelayedScaling, autocast

    module, x = Linear(64, 32), torch.randn(16, 64)

    def weight_grad(under_autocast: bool) -> torch.Tensor:
        module.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=under_autocast), autocast(recipe=DelayedScaling()):
            y = module(x)
        y.float().sum().backward()
        return module.weight.grad

    grad = weight_grad(True)
    assert grad.dtype == torch.float32 and torch.equal(grad, grad.bfloat16().float())
    grad = weight_grad(False)
    assert not torch.equal(grad, grad.bfloat16().float())
