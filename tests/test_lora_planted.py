"""The model-family checks name the site: planted LoRA faults are caught, clean backends pass."""
from __future__ import annotations

import pytest

from planted_lora import PlantedLoRA
from te_verify.backends.eager import EagerBackend
from te_verify.run.caserun import CaseRun
from te_verify.matrix.models import model_spec
from te_verify.spec import ModelConfig

# One block, adapters on q and v, the input needs grad (so the bases' dgrad runs).
SPEC = model_spec("lora", ModelConfig(lora_on=("q", "v")), True)


def _failure(backend) -> str:
    with pytest.raises(AssertionError) as failed:
        CaseRun(SPEC, backend.name, backend).verify()
    return str(failed.value)


def test_discarded_frozen_base_wgrad_is_named_by_site() -> None:
    message = _failure(PlantedLoRA("discarded_wgrad"))
    assert "site blocks.0.attn.q.base (frozen weight): 1 wgrad GEMM, 0 required" in message
    assert "site blocks.0.attn.v.base (frozen weight): 1 wgrad GEMM, 0 required" in message


def test_dropped_b_gradient_is_named_by_parameter() -> None:
    message = _failure(PlantedLoRA("drop_b"))
    assert "blocks.0.attn.q.lora_b.weight" in message and "blocks.0.attn.v.lora_b.weight" in message


def test_base_input_saved_twice_is_named_by_site() -> None:
    message = _failure(PlantedLoRA("save_twice"))
    # The shared input of q, k and v: eager's one storage, plus a copy by each planted base (q's and v's).
    assert "saved their input 3 time(s)" in message and "blocks.0.attn.q.base" in message
    assert "B allowed (" in message  # weighed: three copies' bytes against one copy's


def test_eager_passes_and_meets_the_required_gemms_exactly() -> None:
    run = CaseRun(SPEC, "eager", EagerBackend())
    run.verify()
    assert run.figures["flops_actual"] == run.figures["flops_required"]
    assert run.figures["gemms_outside_sites"] == 0


def test_an_eager_reference_that_cannot_prepare_errors_the_case(monkeypatch) -> None:
    """Both runs raising the same error while preparing is a harness fault, never 'ends as eager ends'."""
    def refuse(self, model, spec):
        raise TypeError("'Llama' object is not iterable")

    monkeypatch.setattr(EagerBackend, "prepare", refuse)
    with pytest.raises(RuntimeError, match="eager reference raised before the measured forward: TypeError"):
        CaseRun(SPEC, "eager", EagerBackend()).verify()
