"""GemmProbe: FLOPs against the notes' measured figures and FlopCounterMode, roles and layers, compile tracing."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from te_verify.backends.eager import EagerBackend
from te_verify.backends.registry import resolve_backend
from te_verify.models.marks import mark_site
from te_verify.oracle.sites import linear_weights
from te_verify.probes.layer_map import LayerMap
from te_verify.probes.flops import GemmProbe, _by_shape
from te_verify.run.runner import run_case
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


class _ReusingStack(torch.autograd.Function):
    """A compiled-style 4-layer stack (widths 32.64.128.64.32, layers 0 and 2 frozen, input without grad) that
    writes layer 1's output gradient into the buffer that held layer 2's input, as inductor reuses dead buffers.
    Layers 1 and 2 have transposed weight shapes, so only data can tell whose wgrad the last GEMM is."""

    @staticmethod
    def forward(ctx, x, w0, w1, w2, w3):
        x1 = torch.mm(x, w0.t())
        x2 = torch.mm(x1, w1.t())
        x3 = torch.mm(x2, w2.t())
        ctx.save_for_backward(x1, x2, x3, w2, w3)
        return torch.mm(x3, w3.t())

    @staticmethod
    def backward(ctx, g):
        x1, x2, x3, w2, w3 = ctx.saved_tensors
        wgrad3 = torch.mm(g.t(), x3)
        g3 = torch.mm(g, w3)
        torch.mm(g3, w2, out=x2)  # layer 1's output gradient, in layer 2's dead input buffer
        wgrad1 = torch.mm(x2.t(), x1)
        return None, None, wgrad1, None, wgrad3


class ReusingBackend:
    name = "reusing"

    def available(self):
        return True, ""

    def prepare(self, model, spec):
        weights = [layer.weight for layer in model]
        return lambda x: _ReusingStack.apply(x.reshape(-1, x.shape[-1]), *weights).reshape(*x.shape[:-1], -1)


def test_a_reused_buffer_is_not_taken_for_the_input_it_once_held():
    spec = CaseSpec("probe", (32, 64, 128, 64, 32), (True, False, True, False), None, False, (8,))
    record = run_case(spec, ReusingBackend(), [GemmProbe()])
    assert record.error is None, record.error
    wgrads = [(e.layer, e.shape) for e in record.observations["gemm_events"] if e.role == "wgrad"]
    assert wgrads == [(3, (32, 64)), (1, (128, 64))]


class _GroupedPointwiseConv(torch.nn.Module):
    """LitGPT's fused-qkv LoRA B: a marked matrix Parameter applied as a grouped, kernel-size-1 conv1d."""

    def __init__(self) -> None:
        super().__init__()
        self.b = torch.nn.Parameter(torch.randn(12, 2, generator=torch.Generator().manual_seed(0)))
        mark_site(self, "b")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv1d(x.transpose(-2, -1), self.b.unsqueeze(-1), groups=2).transpose(-2, -1)


def test_a_marked_site_outlives_its_parameter_object() -> None:
    """FSDP2's fully_shard registers new Parameter objects under the same names: the site must stay a site, or the
    probes' layers (the sites in module order) shift against the oracle's (LitGPT's qkv LoRA under FSDP2 once had
    the attention output attributed to lora_B)."""
    model = _GroupedPointwiseConv()
    model.b = torch.nn.Parameter(model.b.detach().clone())
    assert [site.label for site in linear_weights(model)] == ["b"]


def probe_one_step(model: torch.nn.Module, x: torch.Tensor) -> GemmProbe:
    """A GemmProbe bound to `model` over one forward and one backward of ones."""
    probe = GemmProbe()
    probe.bind(model)
    with probe:
        probe.phase("forward")
        out = model(x)
        probe.phase("backward", 1)
        out.backward(torch.ones_like(out))
    return probe


def test_a_pointwise_convolution_counts_as_the_gemms_it_is() -> None:
    """Forward, input gradient and weight gradient: one GEMM each on the marked weight's site, each 2 x rows x a
    group's in-channels x out-channels (torch 2.13's FlopCounterMode counts a grouped convolution's weight gradient
    `groups` times over, 1,536 FLOPs here, so it is not the reference)."""
    model, x = _GroupedPointwiseConv(), torch.randn(2, 8, 4, requires_grad=True)
    probe = probe_one_step(model, x)
    assert sorted((e.role, e.layer) for e in probe.events) == [("dgrad", 0), ("fprop", 0), ("wgrad", 0)]
    assert [e.flops for e in probe.events] == [2 * (2 * 8) * 2 * 12] * 3


def test_a_sliding_convolution_is_no_gemm() -> None:
    conv = torch.nn.Conv1d(4, 4, kernel_size=3, padding=1, bias=False)
    probe = probe_one_step(conv, torch.randn(2, 4, 8, requires_grad=True))
    assert probe.events == []


_A, _B, _V = torch.randn(3, 4), torch.randn(4, 5), torch.randn(4)
_BA, _BB = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
# Every GEMM-family variant a backend may write (in place, out=, composite), with its 2*m*k*n.
GEMM_VARIANTS = {
    "mm(out=)": (lambda: torch.mm(_A, _B, out=torch.empty(3, 5)), 120),
    "matmul(out=)": (lambda: torch.matmul(_A, _B, out=torch.empty(3, 5)), 120),
    "addmm_": (lambda: torch.zeros(3, 5).addmm_(_A, _B), 120),
    "addmm(out=)": (lambda: torch.addmm(torch.zeros(5), _A, _B, out=torch.empty(3, 5)), 120),
    "_addmm_activation": (lambda: torch._addmm_activation(torch.zeros(5), _A, _B), 120),
    "linear": (lambda: torch.nn.functional.linear(_A, _B.t(), torch.zeros(5)), 120),
    "einsum": (lambda: torch.einsum("ij,jk->ik", _A, _B), 120),
    "bmm(out=)": (lambda: torch.bmm(_BA, _BB, out=torch.empty(2, 3, 5)), 240),
    "baddbmm_": (lambda: torch.zeros(2, 3, 5).baddbmm_(_BA, _BB), 240),
    "addbmm": (lambda: torch.addbmm(torch.zeros(3, 5), _BA, _BB), 240),
    "addbmm_": (lambda: torch.zeros(3, 5).addbmm_(_BA, _BB), 240),
    "mv": (lambda: torch.mv(_A, _V), 24),
    "addmv_": (lambda: torch.zeros(3).addmv_(_A, _V), 24),
}


@pytest.mark.parametrize("variant", list(GEMM_VARIANTS))
def test_every_gemm_variant_is_counted_with_its_flops(variant):
    """A GEMM is work whatever wrote it: in place or into out= (whose result a backend may throw away), composite."""
    run, flops = GEMM_VARIANTS[variant]
    probe = GemmProbe()
    with probe:
        probe.phase("forward")
        run()
    assert [e.flops for e in probe.events] == [flops], [(e.op, e.flops) for e in probe.events]
