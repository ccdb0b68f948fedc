"""TexRecorder over a real TE Linear stack under FP8 DelayedScaling: the forward fprop (TN) and backward dgrad
(NN) / wgrad (NT, grad=True) GEMMs with their m, n, k; no wgrad for the frozen layer; provenance from each
fprop's A to its weight and from each wgrad's A to the activation that layer's fprop consumed; layer labels by
te_verify.probes.tex_gemm.attribute."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu
from te_verify.probes.tex_gemm import attribute, layer_of
from te_verify.te.tecpu.record import TexGemm, TexRecorder, root_key

TOKENS, DIMS, FROZEN = 32, [16, 32, 48, 64], 1  # layer i: DIMS[i] -> DIMS[i + 1]


@pytest.fixture(scope="module")
def run() -> types.SimpleNamespace:
    """One forward and backward of the stack under the recorder; the inputs each layer's forward saw."""
    tecpu.boot()
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(*[te.Linear(i, o, bias=False, params_dtype=torch.float32)
                                  for i, o in zip(DIMS, DIMS[1:])])
    with torch.no_grad():
        for layer in model:
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / layer.weight.shape[1] ** 0.5)
    model[FROZEN].weight.requires_grad_(False)
    inputs: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(model):
        layer.register_forward_hook(lambda mod, args, out, i=i: inputs.__setitem__(i, args[0]))
    x = torch.randn(TOKENS, DIMS[0], generator=g, requires_grad=True)
    recorder = TexRecorder()
    with recorder:
        with te.autocast(enabled=True, recipe=DelayedScaling()):
            y = model(x)
        recorder.phase = "backward"
        y.sum().backward()
    params = {root_key(p): layer_of(n) for n, p in model.named_parameters()}
    return types.SimpleNamespace(model=model, x=x, inputs=inputs, gemms=recorder.record.gemms, params=params)


def of_role(run: types.SimpleNamespace, role: str) -> list[TexGemm]:
    return [g for g in run.gemms if g.role == role]


def test_roles_layouts_and_counts(run) -> None:
    fprop, dgrad, wgrad = (of_role(run, r) for r in ("fprop", "dgrad", "wgrad"))
    assert all(g.phase == "forward" and g.layout == "TN" and not g.grad for g in fprop), f"fprop: {fprop}"
    assert all(g.phase == "backward" and g.layout == "NN" and g.grad for g in dgrad), f"dgrad: {dgrad}"
    assert all(g.phase == "backward" and g.layout == "NT" and g.grad for g in wgrad), f"wgrad: {wgrad}"
    assert (len(fprop), len(dgrad), len(wgrad)) == (3, 3, 2), \
        f"(fprop, dgrad, wgrad) counts {(len(fprop), len(dgrad), len(wgrad))}; all GEMMs: {run.gemms}"
    assert all(g.fp8 for g in run.gemms), f"non-FP8 GEMM under FP8 autocast: {[g for g in run.gemms if not g.fp8]}"
    assert len(run.gemms) == 8, f"unexpected GEMMs recorded: {run.gemms}"


def test_shapes_per_layer(run) -> None:
    labelled = attribute(run.gemms, run.params)
    for i, (d_in, d_out) in enumerate(zip(DIMS, DIMS[1:])):
        want = {"fprop": (TOKENS, d_out, d_in), "dgrad": (TOKENS, d_in, d_out), "wgrad": (d_out, d_in, TOKENS)}
        for e in labelled:
            if e.layer == str(i):
                assert (e.gemm.m, e.gemm.n, e.gemm.k) == want[e.role], \
                    f"layer {i} {e.role}: (m, n, k) = {(e.gemm.m, e.gemm.n, e.gemm.k)}, want {want[e.role]}"


def test_layer_labels_and_frozen_layer_has_no_wgrad(run) -> None:
    by_role = {role: sorted(e.layer for e in attribute(run.gemms, run.params) if e.role == role)
               for role in ("fprop", "dgrad", "wgrad")}
    assert by_role == {"fprop": ["0", "1", "2"], "dgrad": ["0", "1", "2"], "wgrad": ["0", "2"]}, \
        f"layers by role: {by_role} (layer {FROZEN} is frozen)"


def test_fprop_a_operand_resolves_to_weight(run) -> None:
    for i, g in enumerate(of_role(run, "fprop")):
        assert g.a_root == root_key(run.model[i].weight), f"fprop {i}: A root {g.a_root} is not layer {i}'s weight"


def test_wgrad_a_operand_resolves_to_the_activation_its_fprop_consumed(run) -> None:
    assert run.inputs[0] is run.x, "layer 0's forward did not see the model input"
    fprops = of_role(run, "fprop")
    for e in attribute(run.gemms, run.params):
        if e.role != "wgrad":
            continue
        i = int(e.layer)
        activation = root_key(run.inputs[i])
        assert fprops[i].b_root == activation, f"fprop {i}: B root {fprops[i].b_root} is not its input {activation}"
        assert e.gemm.a_root == activation, f"wgrad of layer {i}: A root {e.gemm.a_root} is not its input {activation}"
