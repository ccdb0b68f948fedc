"""TE's GELU jit fusions over the boot run with their compiled kernel's numerics (te/tecpu/jit_fusions.py): on BF16
and FP16 tensors each output is TE's formula evaluated in fp32 and rounded once, where the eager half-precision run
TE's code does with NVTE_TORCH_COMPILE=0 (the planted fault: the step undone) rounds after every op. End to end, TE's
own property (its test_identity_quantizer): LayerNormMLP in BF16 (bias+GELU through the jit fusion) equals bitwise the
same module under an all-identity recipe, whose GELU is the emulated tex.gelu (another formula, fp32 inside)."""
import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.te.tecpu import jit_fusions

HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.fixture(scope="module")
def te():
    tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine.pytorch.jit as jit
    return types.SimpleNamespace(te=te_pytorch, jit=jit)


def _calls(dtype: torch.dtype):
    g = torch.Generator().manual_seed(3)
    x, bias, grad = (torch.randn(shape, generator=g).to(dtype) for shape in ((64, 256), (256,), (64, 256)))
    return {"bias_gelu_fused_": (x, bias), "gelu_fused_": (x,), "dgelu_fused_": (grad, x),
            "bgrad_dgelu_fused_": (grad, x, bias)}


def _outputs(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", jit_fusions.FUSIONS)
def test_each_gelu_fusion_is_te_s_formula_in_fp32_rounded_once(te, name, dtype):
    function, args = getattr(te.jit, name), _calls(dtype)[name]
    formula = function.__wrapped__  # TE's own function, as jit.py defines it
    once = _outputs(formula(*(a.float() for a in args)))
    got, eager = _outputs(function(*args)), _outputs(formula(*args))
    for out, ref in zip(got, once):
        assert out.dtype == dtype and torch.equal(out, ref.to(dtype)), name
    assert any(not torch.equal(e, o) for e, o in zip(eager, got)), f"{name}: eager {dtype} rounding is not seen here"


def test_fp32_arguments_run_as_written(te):
    x, bias = _calls(torch.float32)["bias_gelu_fused_"]
    assert torch.equal(te.jit.bias_gelu_fused_(x, bias), te.jit.bias_gelu_fused_.__wrapped__(x, bias))


def test_layernorm_mlp_in_bf16_equals_its_identity_recipe_run_bitwise(te):
    from transformer_engine.common.recipe import CustomRecipe
    from transformer_engine.pytorch.tensor.identity_tensor import IdentityQuantizer

    def run(recipe):
        torch.manual_seed(7300)
        model = te.te.LayerNormMLP(64, 128, bias=False, params_dtype=torch.bfloat16)
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).requires_grad_(True)
        with te.te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)
        (y.float() * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        return [y, x.grad] + [p.grad for p in model.parameters()]

    bf16, identity = run(None), run(CustomRecipe(qfactory=lambda role: IdentityQuantizer()))
    for name, a, b in zip(["y", "dx", "ln_weight", "ln_bias", "fc1_weight", "fc2_weight"], bf16, identity):
        assert torch.equal(a, b), f"{name}: {(a != b).sum().item()} of {a.numel()} elements differ"


def test_a_te_without_one_of_the_fusions_is_refused_naming_it():
    jit = types.SimpleNamespace(__name__="transformer_engine.pytorch.jit", bias_gelu_fused_=abs, gelu_fused_=abs,
                                dgelu_fused_=abs)
    with pytest.raises(jit_fusions.MissingFusion, match="has no bgrad_dgelu_fused_;"):
        jit_fusions.patch(jit)
