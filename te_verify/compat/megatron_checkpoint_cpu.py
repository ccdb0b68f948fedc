"""Megatron-core's activation checkpoint (`megatron.core.tensor_parallel.checkpoint`) on a CPU-only torch.

Its `CheckpointFunction` saves every RNG state before the forward and restores it around the recompute
(`_get_all_rng_states` / `_set_all_rng_states` / `_fork_rng`, tensor_parallel/random.py:444-472): the CPU
generator's, the RNG tracker's (empty unless a model-parallel region added one) and the CUDA generator's through the
module-level `_get_cuda_rng_state` / `_set_cuda_rng_state`, unconditionally. The CPU stand-ins of
compat.cuda_rng_cpu answer those two with the CPU generator's state.

Applied only on a CPU rank (no CUDA), once per process, by the megatron_ddp engine for recompute "megatron";
guarded by the helpers' signatures in the installed megatron-core (measured on 0.16.1), recorded for the header.
"""
from __future__ import annotations

from te_verify.compat import cuda_rng_cpu, record

MODULE = "megatron.core.tensor_parallel.random"
STEP = ("megatron-checkpoint-cpu-rng: Megatron-core's tensor_parallel.checkpoint saves the CUDA RNG state around "
        "each forward and recompute; on a CPU rank its _get_cuda_rng_state/_set_cuda_rng_state read and set the CPU "
        "generator's (only the no-device, no-clone, non-graph-safe call; anything else raises)")


def apply() -> None:
    """Install the CPU stand-ins in Megatron-core's random module (idempotent); raises where CUDA is present or the
    helpers are not the ones the step was written for."""
    if cuda_rng_cpu.install(MODULE, "megatron-core 0.16.1"):
        record(STEP)
