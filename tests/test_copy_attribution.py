"""GEMMs over views of a weight's copies are that weight's layer's, in the role the copy's axes show
(probes.storage_keys root_view, probes.weight_axes): issue 36's float64 linear, whose dgrad at LitGPT's fused-qkv LoRA A
ran as a bmm over a broadcast of the fp64 weight copy (matmul's path for a transposed output gradient) and was "0 dgrad
GEMM, 1 required"; and a recomputed fprop over a square weight's copy, which the shapes cannot tell from a dgrad."""
from __future__ import annotations

import torch
from planted_accumulation import _Fp64LinearMode

from te_verify.probes.flops import GemmProbe


def _probe(model: torch.nn.Module) -> GemmProbe:
    probe = GemmProbe(follow_copies=True)
    probe.bind(model)
    return probe


def _roles(probe: GemmProbe, phase: str) -> list[tuple[str, int | None]]:
    return sorted((e.role, e.layer) for e in probe.events if e.phase == phase)


def test_a_float64_dgrad_over_a_broadcast_weight_copy_is_the_layers_dgrad():
    """The output gradient arrives transposed (as LitGPT's LoRA B convolution hands it back), so matmul runs the fp64
    dgrad as a bmm over an expanded view of the weight's fp64 copy; a second such dgrad is counted as the layer's."""
    linear = torch.nn.Linear(8, 6, bias=False)
    x = torch.randn(2, 4, 8, requires_grad=True)
    for extra, dgrads in ((False, 1), (True, 2)):
        probe = _probe(linear)
        with probe:
            probe.phase("forward")
            with _Fp64LinearMode():
                y = linear(x)
            probe.phase("backward", 1)
            grad = torch.randn(2, 6, 4).transpose(-2, -1)  # non-contiguous: matmul does not fold it
            y.backward(grad)
            if extra:  # a planted second dgrad, its result thrown away
                torch.matmul(grad.double(), linear.weight.double())
        assert _roles(probe, "backward") == [("dgrad", 0)] * dgrads + [("wgrad", 0)]
        assert any(e.op == "aten.bmm.default" and e.role == "dgrad" for e in probe.events)


def test_a_recomputed_fprop_over_a_square_weights_copies_reads_as_fprop():
    """In backward, x @ W^T over a transposed contiguous copy and over an fp64 copy is an fprop (a recompute); g @ W
    over either copy is a dgrad."""
    linear = torch.nn.Linear(8, 8, bias=False)
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    probe = _probe(linear)
    with probe:
        probe.phase("forward")
        linear(x)
        probe.phase("backward", 1)
        w_t = linear.weight.t().contiguous()  # (in, out), row-major: in-features now at stride 8
        w64 = linear.weight.detach().double()
        x @ w_t, x.double() @ w64.t()  # fprops
        g @ w_t.t(), g.double() @ w64  # dgrads
    assert _roles(probe, "backward") == [("dgrad", 0)] * 2 + [("fprop", 0)] * 2
