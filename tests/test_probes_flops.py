"""GemmProbe: FLOPs against the notes' measured figures and FlopCounterMode, roles and layers, compile tracing."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from te_verify.backends.eager import EagerBackend
from te_verify.backends.registry import resolve_backend
from te_verify.probes.dispatch import LayerMap
from te_verify.probes.flops import GemmProbe, _by_shape
from te_verify.runner import run_case
from te_verify.spec import CaseSpec

# notes/distributed-frozen-params.md section 3: 3 bias-free Linear(64,64), batch 32, input without grad.
NOTES_FLOPS = {
    (False, False, False): 2_097_152,
    (False, True, False): 1_835_008,
    (True, False, False): 1_572_864,
    (True, True, True): 786_432,
}


def notes_spec(frozen: tuple[bool, ...], x_grad: bool = False) -> CaseSpec:
    return CaseSpec("probe", (64, 64, 64, 64), frozen, None, x_grad, (32,))


def flop_counter_total(spec: CaseSpec) -> int:
    """The same run measured with torch's own FlopCounterMode (backward skipped when nothing needs grad)."""
    from te_verify.models import build_model, make_inputs, set_frozen

    model, inputs = build_model(spec), make_inputs(spec)
    set_frozen(model, spec.weight_frozen, spec.bias_frozen)
    with FlopCounterMode(display=False) as counter:
        out = model(inputs.x)
        if out.requires_grad:
            out.backward(inputs.grad_output)
    return counter.get_total_flops()


@pytest.mark.parametrize("frozen", list(NOTES_FLOPS), ids=lambda m: "".join("1" if b else "0" for b in m))
def test_eager_flops_match_notes_and_flop_counter(frozen):
    spec = notes_spec(frozen)
    record = run_case(spec, EagerBackend(), [GemmProbe()])
    assert record.figures["flops_actual"] == NOTES_FLOPS[frozen]
    assert record.figures["flops_actual"] == flop_counter_total(spec)


def test_roles_and_layers_in_a_square_stack_with_middle_frozen():
    record = run_case(notes_spec((False, True, False)), EagerBackend(), [GemmProbe()])
    seen = sorted((e.pass_index, e.layer, e.role) for e in record.observations["gemm_events"])
    assert seen == [(0, 0, "fprop"), (0, 1, "fprop"), (0, 2, "fprop"),
                    (1, 0, "wgrad"), (1, 1, "dgrad"), (1, 2, "dgrad"), (1, 2, "wgrad")]


def test_replays_and_3d_inputs_with_bias_are_attributed():
    spec = CaseSpec("probe", (8, 16, 12), (True, False), (False, True), False, (2, 3), replays=2)
    record = run_case(spec, EagerBackend(), [GemmProbe()])
    events = record.observations["gemm_events"]
    assert all(e.layer is not None and e.role != "unknown" for e in events)
    for k in (1, 2):  # layer 0's bias is trainable, so layer 1's input needs grad
        assert sorted((e.layer, e.role) for e in events if e.pass_index == k) == [(1, "dgrad"), (1, "wgrad")]


def test_shape_fallback_says_unknown_when_batch_equals_width():
    layers = LayerMap(weight_shapes=[(4, 4), (4, 4)], input_shapes=[(4, 4), (4, 4)])
    assert _by_shape(layers, (4, 4)) == ("unknown", None)
    layers = LayerMap(weight_shapes=[(6, 4), (3, 6)], input_shapes=[(8, 4), (8, 6)])
    assert _by_shape(layers, (4, 6)) == ("wgrad", 0)
    assert _by_shape(layers, (8, 6)) == ("dgrad", 1)


@pytest.mark.parametrize("backend_name", ["torch_compile", "thunder"])
def test_compiler_tracing_is_not_counted(backend_name):
    """The first call compiles inside the probe; only the compiled run's real GEMMs may count."""
    backend = resolve_backend(backend_name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    spec = notes_spec((False, True, False))
    record = run_case(spec, backend, [GemmProbe()])
    assert record.error is None, record.error
    assert record.figures["flops_actual"] == NOTES_FLOPS[(False, True, False)]
    assert record.figures["gemms_unattributed"] == 0
