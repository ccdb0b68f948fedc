"""LayerNormMLP(checkpoint=True) over the tex emulation, through the CPU RNG step (compat.te_checkpoint_cpu over
compat.cuda_rng_cpu). LayerNormMLP saves the CUDA RNG state in its graph-safe form, on a GPU a pointer to the CUDA
generator's live state; its recompute replays the forward's random stream because TE restores the CPU generator
(on the CPU run, the emulated device's) just before it.
- checkpoint=True matches checkpoint=False bitwise (output, input and parameter gradients, and where the random
  stream is left): the recompute runs the forward's ops in the same order on the same inputs, and TE's own
  test_layernorm_mlp_accuracy_checkpoint asserts rtol=0, atol=0;
- with a dropout planted in the activation (tex.srelu) the recompute draws the forward's mask; a stand-in whose
  restore sets another state than the one handed to it (the last it saved) makes the recompute draw another mask:
  fc2's weight gradient differs, caught and named;
- the graph-safe stand-ins behave as a GPU's graphsafe_get_state/graphsafe_set_state (setting the pointer back does
  not rewind the stream); what they do not cover raises naming the call; an importer that did not bind TE's helpers
  is refused before anything is patched.
"""
from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from planting import loaded_tex, patched
from te_verify.compat import cuda_rng_cpu, te_checkpoint_cpu


@pytest.fixture(scope="module")
def api(te_python):
    booted = te_python.api  # boots TE over the emulation, which the step patches
    te_checkpoint_cpu.apply()
    return booted


def _layernorm_mlp_module():
    return importlib.import_module(te_checkpoint_cpu.IMPORTERS[0])


def _mismatches(api) -> list[str]:
    """What differs between LayerNormMLP with checkpoint=True and the same module with checkpoint=False after one
    forward and backward from the same random state (srelu reaches tex.srelu)."""
    torch.manual_seed(0)
    mlps = [api.LayerNormMLP(32, 64, activation="srelu", params_dtype=torch.float32, device="cpu", checkpoint=c)
            for c in (True, False)]
    mlps[1].load_state_dict(mlps[0].state_dict())
    x = torch.randn(16, 32)
    checkpointed, plain = (_step(mlp, x) for mlp in mlps)
    return [name for name in plain if not torch.equal(checkpointed[name], plain[name])]


def _step(mlp: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    x = x.clone().requires_grad_()
    out = mlp(x)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return {"output": out.detach(), "input grad": x.grad, **{f"{n} grad": p.grad for n, p in mlp.named_parameters()},
            "random state after": torch.get_rng_state()}


def _dropout_before(original):
    """srelu of a dropout of its input: LayerNormMLP's forward and its recompute each draw a mask."""
    def srelu(x, quantizer):
        return original(torch.nn.functional.dropout(x, p=0.5), quantizer)
    return srelu


def _restores_the_last_saved():
    """Stand-ins whose restore sets the last state they saved, whatever state they are handed."""
    saved = []

    def get_state(device="cuda", clone=False, graph_safe=True):
        saved[:] = [torch.get_rng_state()]
        return cuda_rng_cpu.LIVE

    def set_state(new_state, device=-1, graph_safe=True):
        torch.set_rng_state(saved[0])

    return get_state, set_state


def test_the_step_replaces_layernorm_mlps_own_import_of_the_helpers(api):
    distributed = importlib.import_module(te_checkpoint_cpu.MODULE)
    for name in cuda_rng_cpu.SIGNATURES:
        assert getattr(_layernorm_mlp_module(), name) is getattr(distributed, name)
        assert getattr(distributed, name).__te_verify_step__


def test_checkpointed_layernorm_mlp_matches_the_plain_one_bitwise(api):
    assert _mismatches(api) == []


def test_a_recompute_with_dropout_draws_the_forwards_mask(api):
    with patched(loaded_tex(), "srelu", _dropout_before):
        assert _mismatches(api) == []


def test_a_restore_of_another_state_makes_the_recompute_draw_another_mask(api):
    get_state, set_state = _restores_the_last_saved()
    module = _layernorm_mlp_module()
    with patched(loaded_tex(), "srelu", _dropout_before), \
            patched(module, "_get_cuda_rng_state", lambda _: get_state), \
            patched(module, "_set_cuda_rng_state", lambda _: set_state):
        assert _mismatches(api) == ["fc2_weight grad"]  # the recomputed activation is fc2's wgrad operand


_GET, _SET = cuda_rng_cpu.stand_ins(te_checkpoint_cpu.MODULE, graph_safe_calls=True).values()


def test_setting_the_graph_safe_state_back_does_not_rewind_the_stream():
    """As on a GPU, where graphsafe_get_state answers a pointer to the live state; the plain state rewinds."""
    torch.manual_seed(2)
    stream = torch.rand(8)
    torch.manual_seed(2)
    state = _GET()
    first = torch.rand(4)
    _SET(state)
    assert torch.equal(torch.cat([first, torch.rand(4)]), stream)
    state = _GET(graph_safe=False)
    first = torch.rand(4)
    _SET(state, graph_safe=False)
    assert torch.equal(torch.rand(4), first)


def test_an_importer_that_did_not_bind_the_helpers_is_refused_before_anything_is_patched(monkeypatch):
    def get_state(device="cuda", clone=False, graph_safe=True):
        pass

    def set_state(new_state, device=-1, graph_safe=True):
        pass

    helpers = types.ModuleType("fake_distributed")
    helpers._get_cuda_rng_state, helpers._set_cuda_rng_state = get_state, set_state
    importer = types.ModuleType("fake_importer")
    importer._get_cuda_rng_state, importer._set_cuda_rng_state = get_state, lambda *a: None
    monkeypatch.setitem(sys.modules, "fake_distributed", helpers)
    monkeypatch.setitem(sys.modules, "fake_importer", importer)
    with pytest.raises(cuda_rng_cpu.CudaRngStepError,
                       match=r"fake_importer._set_cuda_rng_state is not fake_distributed's \(written for TE 9\)"):
        cuda_rng_cpu.install("fake_distributed", "TE 9", ("fake_importer",), graph_safe_calls=True)
    assert helpers._get_cuda_rng_state is get_state
