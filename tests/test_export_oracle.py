"""The oracle read from a torch.export graph (te_verify.oracle.export): equal to the fx oracle wherever both trace, and
on the library-model families (transformers + peft, LitGPT), whose sites fx cannot read."""
from __future__ import annotations

import pytest
import torch

from te_verify.oracle.export import ExportGraphError, export_sites
from te_verify.models.marks import mark_site
from te_verify.oracle.graph import _Tracer, fx_sites
from te_verify.oracle.sites import linear_weights
from te_verify.matrix.dist import dist_lora_specs
from te_verify.matrix.models import lora_specs, real_model_spec, stage_specs
from te_verify.matrix.te import te_lora_specs
from te_verify.models import CPU, frozen_at_backward, make_inputs
from te_verify.oracle.required import backward_gemms, required_saved, sites
from te_verify.spec import CaseSpec

# Every spec of our own Llama family (fx traces it); the library models' only export.
FAMILY_SPECS = [s for s in (*lora_specs("nightly"), *stage_specs("nightly"), *dist_lora_specs("nightly"),
                            *te_lora_specs("nightly")) if s.model.kind == "llama"]
FIELDS = ("label", "layer", "rows", "fan_in", "fan_out", "weight_trainable", "bias_trainable", "input_needs_grad",
          "input_is_model_input")


def _shared_inputs(found) -> set[frozenset]:
    """Which sites read one value (the tracers name values differently; the grouping is what the saves follow)."""
    groups: dict[str, set] = {}
    for s in found:
        groups.setdefault(s.input_value, set()).add(s.label)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("spec", FAMILY_SPECS, ids=lambda s: s.id)
def test_export_oracle_equals_the_fx_oracle(spec: CaseSpec) -> None:
    model = frozen_at_backward(spec, CPU)
    x = make_inputs(spec, device=CPU).x
    fx = fx_sites(model, _Tracer().trace(model), x)
    exported = export_sites(model, x)  # every one traces, TE's Linear over the tex emulation included
    assert [tuple(getattr(s, f) for f in FIELDS) for s in exported] == \
           [tuple(getattr(s, f) for f in FIELDS) for s in fx]
    assert _shared_inputs(exported) == _shared_inputs(fx)


def test_litgpt_adapters_are_sites_named_by_parameter() -> None:
    """LitGPT's adapters are Parameters: `F.linear(x, lora_A)` and a grouped conv1d for the fused qkv, `x @ A.T @ B.T`
    elsewhere; each is a site with the GEMM shape it runs, in module order."""
    spec = real_model_spec("litgpt_lora", "qv", frozen=("embedding", "head", "norms"))
    by_name = {s.label: s for s in sites(spec)}
    qkv_a, qkv_b = by_name["transformer.h.0.attn.qkv.lora_A"], by_name["transformer.h.0.attn.qkv.lora_B"]
    assert (qkv_a.rows, qkv_a.fan_in, qkv_a.fan_out) == (16, 32, 8)  # rank 4 for each of q and v, stacked
    assert (qkv_b.rows, qkv_b.fan_in, qkv_b.fan_out) == (16, 4, 64)  # conv1d, 2 groups: r in, q's and v's 32 out
    assert by_name["transformer.h.0.attn.qkv.linear"].roles() == set()  # frozen base, nothing upstream trains
    assert qkv_a.roles() == {"wgrad"} and qkv_b.roles() == {"dgrad", "wgrad"}
    model = frozen_at_backward(spec, CPU)
    assert [s.label for s in sites(spec)] == [site.label for site in linear_weights(model)]
    # Saved: the normed input (for A's wgrad) and A's output (for B's, read through the transpose conv1d needs).
    assert required_saved(spec).count == 2


def test_litgpt_mlp_adapters_run_as_matmuls() -> None:
    spec = real_model_spec("litgpt_lora", "mlp", frozen=("embedding", "head", "norms"))
    by_name = {s.label: s for s in sites(spec)}
    a, b = by_name["transformer.h.0.mlp.fc_1.lora_A"], by_name["transformer.h.0.mlp.fc_1.lora_B"]
    assert (a.fan_in, a.fan_out, b.fan_in, b.fan_out) == (32, 4, 4, 64)
    names = {s.layer: s.label for s in sites(spec)}
    assert ("transformer.h.0.mlp.fc_1.linear", "wgrad") not in [(names[k], r) for k, r in backward_gemms(spec)]


def test_peft_sites_are_peft_module_paths() -> None:
    """peft's LoRA: base_layer frozen (dgrad only), lora_A.default / lora_B.default trained; PEFT's
    layers_to_transform leaves the frozen block without adapters."""
    spec = real_model_spec("hf_peft", "qv", x_grad=True, tokens=False, blocks=2, frozen_blocks=1)
    by_name = {s.label: s for s in sites(spec)}
    prefix = "hf.base_model.model.layers"
    assert f"{prefix}.0.self_attn.q_proj" in by_name and f"{prefix}.0.self_attn.q_proj.base_layer" not in by_name
    assert by_name[f"{prefix}.1.self_attn.q_proj.base_layer"].roles() == {"dgrad"}
    assert by_name[f"{prefix}.1.self_attn.q_proj.lora_A.default"].roles() == {"dgrad", "wgrad"}
    assert by_name[f"{prefix}.0.self_attn.q_proj"].roles() == {"dgrad"}  # frozen block, input needs grad


class _Owner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 4))
        mark_site(self, "w")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Borrower(torch.nn.Module):
    """Multiplies a matrix another module holds: the graph's module path and the site's owner disagree."""

    def __init__(self, owner: _Owner) -> None:
        super().__init__()
        self.owner = [owner]  # not a child: the weight is reached only by reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.owner[0].w.T


def test_a_weight_multiplied_outside_its_module_is_refused_naming_both() -> None:
    owner = _Owner()
    model = torch.nn.Sequential(owner, _Borrower(owner))
    with pytest.raises(ExportGraphError, match=r"module '1' multiplies site '0\.w'"):
        export_sites(model, torch.ones(2, 4))
