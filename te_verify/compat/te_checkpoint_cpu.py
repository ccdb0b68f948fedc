"""TE's activation checkpoints (`transformer_engine.pytorch.distributed.checkpoint`, `LayerNormMLP(checkpoint=True)`)
on a CPU-only torch.

Both save and restore the CUDA RNG state around every forward and recompute through two helpers of TE's distributed
module, `_get_cuda_rng_state` and `_set_cuda_rng_state`, unconditionally: the checkpoint's reentrant Function and
`_CheckpointFrame` with graph_safe False (no graph-safe RNG tracker), LayerNormMLP's `_forward` with TE's default,
graph_safe True, through its own `from ..distributed import` of them. The CPU stand-ins of compat.cuda_rng_cpu answer
with the CPU generator's state, the graph-safe call with a pointer to its live state, as `graphsafe_get_state` does on
a GPU. The step serves both users of TE's Python over the emulation: the te_eager lane (backends.te_eager) and TE's
own tests (scripts/te_own_tests_shim.py).

Applied only for the CPU run (the emulated --te-impl, no CUDA), once per process; guarded by the two helpers'
signatures in the installed TE and by LayerNormMLP's import of them (measured on 2.20.2: compat.versions), recorded
for the report header.
"""
from __future__ import annotations

from te_verify.compat import cuda_rng_cpu, record

MODULE = "transformer_engine.pytorch.distributed"
# The TE modules that bind the helpers by name (TE 2.20.2).
IMPORTERS = ("transformer_engine.pytorch.module.layernorm_mlp",)
STEP = ("te-checkpoint-cpu-rng: TE's distributed.checkpoint and LayerNormMLP(checkpoint=True) save the CUDA RNG state "
        "around each forward and recompute; on the CPU run _get_cuda_rng_state/_set_cuda_rng_state (distributed's and "
        "LayerNormMLP's import of them) read and set the CPU generator's, the graph-safe call (LayerNormMLP's) as a "
        "pointer to its live state, as graphsafe_get_state on a GPU (setting it back sets nothing; TE restores the CPU "
        "generator itself beside it); only the default device and no clone (no graph-safe RNG tracker); anything "
        "else raises")


def apply() -> None:
    """Install the CPU stand-ins in TE's distributed module and LayerNormMLP's (idempotent); raises where CUDA is
    present or TE's helpers are not the ones the step was written for."""
    if cuda_rng_cpu.install(MODULE, "TE 2.20.2", IMPORTERS, graph_safe_calls=True):
        record(STEP)
