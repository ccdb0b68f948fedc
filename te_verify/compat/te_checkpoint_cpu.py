"""TE's activation checkpoint (`transformer_engine.pytorch.distributed.checkpoint`) on a CPU-only torch.

TE's checkpoint saves and restores the CUDA RNG state around every forward and recompute through two module-level
helpers, `_get_cuda_rng_state` and `_set_cuda_rng_state` (its reentrant Function's forward and backward, and
`_CheckpointFrame.cache_rng_states` / `restore_rng_states` of the non-reentrant path), unconditionally. The CPU
stand-ins of compat.cuda_rng_cpu answer them with the CPU generator's state.

Applied only for the CPU run (the emulated --te-impl, no CUDA), once per process; guarded by the two helpers'
signatures in the installed TE (measured on 2.20.2: compat.versions), recorded for the report header.
"""
from __future__ import annotations

from te_verify.compat import cuda_rng_cpu, record

MODULE = "transformer_engine.pytorch.distributed"
STEP = ("te-checkpoint-cpu-rng: TE's distributed.checkpoint saves the CUDA RNG state around each forward and "
        "recompute; on the CPU run its _get_cuda_rng_state/_set_cuda_rng_state read and set the CPU generator's "
        "(only the no-device, no-clone, non-graph-safe call; anything else raises)")


def apply() -> None:
    """Install the CPU stand-ins in TE's distributed module (idempotent); raises where CUDA is present or TE's
    helpers are not the ones the step was written for."""
    if cuda_rng_cpu.install(MODULE, "TE 2.20.2"):
        record(STEP)
