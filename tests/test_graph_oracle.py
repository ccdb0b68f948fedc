"""The graph oracle (te_verify.oracle.graph) against the stack rule, and on the Llama family's structure."""
from __future__ import annotations

import pytest
import torch

from te_verify.oracle.graph import graph_sites
from te_verify.matrix.stacks import FAMILIES
from te_verify.matrix.models import LORA_TARGETS, model_spec
from te_verify.models import CPU, build_model, freeze, make_inputs
from te_verify.oracle.required import backward_gemms, required_saved, sites
from te_verify.spec import CaseSpec, ModelConfig, SpecError

STACK_SPECS = [s for family in FAMILIES.values() for s in family("pr")]


def _graph_of(spec: CaseSpec):
    model = build_model(spec, CPU)
    if spec.freeze_timing != "unfreeze_after":
        freeze(model, spec)
    return graph_sites(model, make_inputs(spec, device=CPU).x)


@pytest.mark.parametrize("spec", STACK_SPECS, ids=lambda s: s.id)
def test_graph_rule_equals_the_stack_rule(spec: CaseSpec) -> None:
    """Read from the fx graph, every stack site needs what the stack indices say it needs."""
    graph = {g.layer: g for g in _graph_of(spec)}
    for site in sites(spec):
        g = graph[site.layer]
        assert (g.input_needs_grad, g.weight_trainable, g.bias_trainable, g.rows) == \
               (site.input_needs_grad, site.weight_trainable, site.bias_trainable, site.rows), site.label
        assert g.input_is_model_input == (site.layer == 0)


def test_lora_sites_follow_the_module_graph() -> None:
    spec = model_spec("lora", ModelConfig(blocks=2, frozen_blocks=1, lora_on=("q", "v")))
    by_name = {s.label: s for s in sites(spec)}
    first, second = by_name["blocks.0.attn.q.lora_a"], by_name["blocks.1.attn.q.lora_a"]
    assert first.roles() == set()  # a frozen block with no trainable upstream: no backward work at all
    assert second.roles() == {"dgrad", "wgrad"}  # block 1's norm trains: its input needs a gradient
    assert by_name["blocks.1.attn.q.base"].roles() == {"dgrad"}  # the frozen base: dgrad only, never wgrad
    assert by_name["blocks.1.attn.q.lora_b"].input_value == "blocks_1_attn_q_lora_a"  # B reads A's output


def test_sites_sharing_an_input_save_it_once() -> None:
    spec = model_spec("lora", ModelConfig(lora_on=LORA_TARGETS["attn"], frozen=("norms",)))
    need = required_saved(spec)
    # q, k, v read one normed value (saved once for their adapters' A); each B reads its A's output; o's A reads
    # the attention output.
    assert need.count == 1 + 4 + 1
    assert all(kind == "input" for _, kind, _ in need.items)


def test_backward_gemms_are_per_site_last_first() -> None:
    spec = model_spec("lora", ModelConfig(lora_on=("q",), frozen=("norms",)))
    names = {s.layer: s.label for s in sites(spec)}
    gemms = [(names[layer], role) for layer, role in backward_gemms(spec)]
    # Everything downstream of q's adapter carries its gradient (dgrad); nothing upstream of it needs one, so
    # k, v, q's base and q's A run no dgrad, and only the adapter's weights a wgrad.
    assert gemms == [("blocks.0.mlp.proj", "dgrad"), ("blocks.0.mlp.fc_2", "dgrad"), ("blocks.0.mlp.fc_1", "dgrad"),
                     ("blocks.0.attn.o", "dgrad"), ("blocks.0.attn.q.lora_b", "dgrad"),
                     ("blocks.0.attn.q.lora_b", "wgrad"), ("blocks.0.attn.q.lora_a", "wgrad")]


def test_every_linear_is_a_site_in_module_order() -> None:
    spec = model_spec("stages", ModelConfig(embedding=True, head=True))
    model = build_model(spec, CPU)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert [s.label for s in sites(spec)] == linears


@pytest.mark.parametrize("change, culprit", [
    (dict(lora_on=("q", "x")), "model.lora_on"),
    (dict(n_embd=30, n_head=4), "model.n_embd=30"),
    (dict(frozen_blocks=3), "model.frozen_blocks=3"),
    (dict(frozen=("head",)), "model.frozen"),
    (dict(te_base=True), "model.te_base"),
])
def test_bad_model_config_names_the_field(change: dict, culprit: str) -> None:
    cfg = ModelConfig(**change)
    with pytest.raises(SpecError, match=culprit.replace(".", r"\.").replace("(", r"\(")):
        CaseSpec("lora", (cfg.in_width, cfg.out_width), (), None, False, (2, 8), model=cfg)


def test_model_widths_and_masks_are_checked() -> None:
    with pytest.raises(SpecError, match="widths="):
        CaseSpec("lora", (32, 64), (), None, False, (2, 8), model=ModelConfig())
    with pytest.raises(SpecError, match="weight_frozen/bias_frozen"):
        CaseSpec("lora", (32, 32), (True,), None, False, (2, 8), model=ModelConfig())
    with pytest.raises(SpecError, match="token ids"):
        CaseSpec("lora", (48, 32), (), None, True, (2, 8), model=ModelConfig(embedding=True))


def test_model_spec_round_trips_through_a_dict() -> None:
    spec = model_spec("lora", ModelConfig(blocks=2, lora_on=("q", "v"), frozen=("norms",)), True, replays=2)
    assert CaseSpec.from_dict(spec.to_dict()) == spec
