"""The library-model families (hf_peft: transformers + peft; litgpt_lora: LitGPT): built bit-identically, eager meets
the oracle's GEMMs exactly on every case, a planted waste is named by module path, bad configs name the field, and
the transformers compatibility step is guarded."""
from __future__ import annotations

import pytest
import torch

from planted_real_models import DiscardedBaseWgrad
from te_verify.backends.eager import EagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.compat import APPLIED
from te_verify.compat import transformers_output_capture as capture
from te_verify.matrix.models import hf_peft_specs, litgpt_lora_specs, real_model_spec
from te_verify.models import CPU, build_model, make_inputs
from te_verify.spec import CaseSpec, ModelConfig, SpecError

NIGHTLY = [*hf_peft_specs("nightly"), *litgpt_lora_specs("nightly")]


@pytest.mark.parametrize("spec", NIGHTLY, ids=lambda s: s.id)
def test_eager_meets_the_required_gemms_exactly(spec: CaseSpec) -> None:
    run = CaseRun(spec, "eager", EagerBackend())
    run.verify()
    assert run.figures["flops_actual"] == run.figures["flops_required"]
    assert run.figures["gemms_unattributed"] == 0 and run.figures["gemms_outside_sites"] == 0
    assert "gemm_attribution" not in run.figures  # no site ran fewer GEMMs than required either


@pytest.mark.parametrize("kind", ["hf_peft", "litgpt_lora"])
def test_two_builds_are_bit_identical_and_seeded(kind: str) -> None:
    spec = real_model_spec(kind, "all", dtype="bf16")
    first, second = build_model(spec, CPU), build_model(spec, CPU)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    other = build_model(spec.replace(seed=1), CPU)
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))
    b_weights = [p for n, p in first.named_parameters() if "lora_B" in n]
    assert b_weights and all(p.abs().sum() > 0 for p in b_weights)  # B non-zero: A's gradient is seen in values


# The bases' inputs need a gradient (hidden states that do; a trained norm upstream), so their backward runs.
@pytest.mark.parametrize("spec, base", [
    (real_model_spec("hf_peft", "qv", x_grad=True, tokens=False),
     "hf.base_model.model.layers.0.self_attn.q_proj.base_layer"),
    (real_model_spec("litgpt_lora", "mlp", frozen=("embedding", "head")), "transformer.h.0.mlp.fc_1.linear"),
], ids=["hf_peft", "litgpt_lora"])
def test_a_discarded_lora_base_wgrad_fails_naming_the_module_path(spec: CaseSpec, base: str) -> None:
    backend = DiscardedBaseWgrad()
    with pytest.raises(AssertionError) as failed:
        CaseRun(spec, backend.name, backend).verify()
    assert f"site {base} (frozen weight): 1 wgrad GEMM, 0 required" in str(failed.value)


@pytest.mark.parametrize("changes, culprit", [
    (dict(kind="litgpt_lora", embedding=False, head=True), "model.embedding=False: a litgpt_lora model takes token"),
    (dict(kind="litgpt_lora", embedding=True, head=False), "model.head=False: a litgpt_lora model always has"),
    (dict(kind="litgpt_lora", embedding=True, head=True, lora_on=("fc_1",)), "all of ('fc_1', 'fc_2', 'proj')"),
    (dict(kind="hf_peft", lora_on=("q",), blocks=2, frozen_blocks=2), "model.frozen_blocks=2: a hf_peft model"),
    (dict(kind="gpt2"), "model.kind='gpt2': expected one of"),
])
def test_a_config_a_family_cannot_build_names_the_field(changes: dict, culprit: str) -> None:
    cfg = ModelConfig(**changes)
    with pytest.raises(SpecError, match=culprit.replace("(", r"\(").replace(")", r"\)")):
        CaseSpec(cfg.kind, (cfg.in_width, cfg.out_width), (), None, False, (2, 8), model=cfg)


def test_the_output_capture_step_is_applied_listed_and_refuses_capture() -> None:
    spec = real_model_spec("hf_peft", "qv", tokens=True)
    build_model(spec, CPU)(make_inputs(spec, device=CPU).x)
    import transformers.utils.output_capturing as oc

    assert isinstance(oc._active_collector, capture.StatelessCollector) and capture.STEP in APPLIED
    with pytest.raises(capture.OutputCaptureStepError, match="output capture requested"):
        oc._active_collector.set({"hidden_states": []})


def test_the_output_capture_step_refuses_another_transformers(monkeypatch) -> None:
    monkeypatch.setattr(capture.importlib.metadata, "version", lambda name: "6.0.0")
    with pytest.raises(capture.OutputCaptureStepError, match="transformers 6.0.0: .* written for transformers 5.x"):
        capture.apply()
