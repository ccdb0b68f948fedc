"""Activation recompute (CaseSpec.recompute) around a model's blocks, in one place for every family.

A checkpointed block keeps only its inputs from the forward; backward runs its forward again to get what its own
backward reads. The block's modules stay where they are (same names, same parameters, same order), so freezing,
the probes' layer order and every backend see the model they would see without recompute: the checkpoint is part
of the model under test, and the eager reference runs it too.

Modes: "nonreentrant" and "reentrant" are torch.utils.checkpoint.checkpoint with use_reentrant False / True. An
engine's own ("deepspeed": deepspeed.checkpointing.checkpoint, reentrant) is set on the rank's model by the engine that
wraps it (CheckpointedStack.checkpoint); eager's reference and the fp64 truth run torch's reentrant one. TE's own
checkpoint ("te", "te_nonreentrant": the TE lane's, backends.te_eager) wraps the same blocks of TE modules; the torch
model those modules share their Parameters with (eager's reference, the fp64 truth) runs torch's checkpoint of the
same reentrancy in its place (spec.REENTRANT_MODES): TE's checkpoint is torch's plus TE's FP8 and RNG state. A
reentrant checkpoint runs its block under no_grad, so a block none of whose inputs needs a gradient gives its parameters
none (torch warns "None of the inputs have requires_grad=True"): the matrix does not generate such
cases (matrix.recompute.reentrant_drops_grads).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.utils.checkpoint

from te_verify.spec import ENGINE_RECOMPUTE_MODES, REENTRANT_MODES

# The linear stack's blocks: consecutive layers (0, 1), (2, 3), ...; a last odd layer is a block of its own.
REGION_LAYERS = 2


def regions(n_layers: int) -> list[range]:
    """The stack's checkpointed blocks, as ranges of layer indices."""
    return [range(i, min(i + REGION_LAYERS, n_layers)) for i in range(0, n_layers, REGION_LAYERS)]


# An engine's own checkpoint function: checkpoint(block, x) -> block(x), its forward's activations dropped.
CheckpointFunction = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor]


def torch_equivalent(mode: str) -> str:
    """The torch checkpoint mode that computes as `mode` does: an engine's own checkpoint (spec.ENGINE_RECOMPUTE_MODES)
    is torch's reentrant one outside the engine's ranks (eager's reference, the fp64 truth, the oracle)."""
    return "reentrant" if mode in ENGINE_RECOMPUTE_MODES else mode


def run_block(mode: str, block: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              checkpoint: CheckpointFunction | None = None) -> torch.Tensor:
    """`block(x)` under the recompute `mode` (CaseSpec.recompute): with `checkpoint` where an engine set its own
    (spec.ENGINE_RECOMPUTE_MODES), else torch's of the mode's reentrancy; as is for "none"."""
    if mode == "none":
        return block(x)
    if checkpoint is not None:
        return checkpoint(block, x)
    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=mode in REENTRANT_MODES)


class CheckpointedStack(torch.nn.Sequential):
    """The linear stack with each block of REGION_LAYERS layers run under `recompute`; iterates and names its layers
    as the plain Sequential does ("0", "1", ...)."""

    def __init__(self, layers: list[torch.nn.Module], recompute: str) -> None:
        super().__init__(*layers)
        self.recompute = recompute
        # An engine's own checkpoint function (set by the engine that wraps this model, in its rank); None: torch's.
        self.checkpoint: CheckpointFunction | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Plain loops and a closure, no generator: thunder's interpreter cannot take len() of one.
        layers = [self[i] for i in range(len(self))]
        for block in regions(len(layers)):
            x = run_block(self.recompute, chain([layers[i] for i in block]), x, self.checkpoint)
        return x


def chain(layers: list[torch.nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    """One block's layers applied in order."""
    def block(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = layer(x)
        return x

    return block
