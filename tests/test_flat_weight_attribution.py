"""Weights flattened into one buffer are still one layer each (probes.watcher.Watcher.weight_layer_of): DeepSpeed
ZeRO-1/2 make every trainable Parameter a view of one flat buffer, so their storage names no layer; under a checkpoint
backward multiplies detached views of them (no Parameter behind). Before the exact-view key every such GEMM read as
the last flattened layer's ("layer 3: 3 fprop GEMM, 1 required", dist_recompute on ZeRO-1, 2026-11-29)."""
from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint

from te_verify.probes.flops import GemmProbe

WIDTHS = (16, 24, 40, 8, 12)  # distinct shapes: a wrong layer cannot hide behind a shared one
FROZEN = 1  # the layer left out of the flat buffer, as ZeRO leaves frozen Parameters


def _flat_stack() -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(i, o, bias=False) for i, o in zip(WIDTHS, WIDTHS[1:])]
    layers[FROZEN].weight.requires_grad_(False)
    trained = [layer.weight for k, layer in enumerate(layers) if k != FROZEN]
    flat = torch.cat([w.detach().reshape(-1) for w in trained])
    offset = 0
    for w in trained:  # as DeepSpeed's _update_model_bit16_weights does
        w.data = flat[offset:offset + w.numel()].view_as(w)
        offset += w.numel()
    return torch.nn.Sequential(*layers)


def _run(model: torch.nn.Sequential, checkpointed: bool) -> list[tuple[str, str, int | None]]:
    probe = GemmProbe()
    probe.bind(model)
    x = torch.randn(8, WIDTHS[0], requires_grad=True)
    with probe:
        probe.phase("forward")
        if checkpointed:
            h = torch.utils.checkpoint.checkpoint(lambda t: model[1](model[0](t)), x, use_reentrant=False)
            y = torch.utils.checkpoint.checkpoint(lambda t: model[3](model[2](t)), h, use_reentrant=False)
        else:
            y = model(x)
        probe.phase("backward", 1)
        y.sum().backward()
    return sorted((e.phase, e.role, e.layer) for e in probe.events)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_flattened_weights_are_attributed_to_their_own_layers(checkpointed):
    got = _run(_flat_stack(), checkpointed)
    want = [("forward", "fprop", k) for k in range(4)]
    want += [("backward", "dgrad", k) for k in range(4)] + [("backward", "wgrad", k) for k in (0, 2, 3)]
    # Each block's recompute runs up to what its backward reads (torch's early stop): the first layer's output.
    want += [("backward", "fprop", k) for k in (0, 2)] if checkpointed else []
    assert got == sorted(want)
