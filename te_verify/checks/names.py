"""Every check name a Verdict can carry: what an expectation's `checks` may name.

A new check adds its name here, one line, in order; tests/test_reliability.py fails when a name used in the code
(Verdict(...), not_observed(...) and the helpers that pass a name through to them) is missing. An expectations file
naming any other check is refused when it is loaded (te_verify.expectations).
"""
from __future__ import annotations

import difflib

CHECKS: tuple[str, ...] = (
    "collective_dtypes",  # checks/collective_dtypes.py
    "compare_options",  # run/compare_options.py
    "dist_grad_parity",  # checks/dist_parity.py
    "dist_output_parity",  # checks/dist_parity.py
    "dist_schedule_parity",  # checks/dist_parity.py
    "dist_state_left_behind",  # checks/dist_parity.py
    "dist_waste_flops",  # distributed/verify.py
    "dist_waste_saved",  # distributed/verify.py
    "ending",  # checks/ending.py
    "engine_state",  # checks/training.py
    "fp8_copies",  # checks/fp8_copies.py
    "fp8_copies_made",  # checks/fp8_copies.py
    "fp8_scaling",  # checks/fp8_scaling.py
    "fp8_shape_error",  # cases/test_te_fp8.py
    "fp8_shape_unclaimed",  # cases/test_te_fp8.py
    "frozen_collectives",  # checks/collectives.py
    "gathered_peak",  # checks/reshard.py
    "gemm_sources_agree",  # checks/te_waste.py
    "gemm_work",  # checks/te_waste.py
    "grad_accumulation",  # cases/test_te_delayed.py
    "grad_meta",  # checks/leftovers.py
    "grad_parity",  # checks/parity.py
    "grad_presence",  # checks/presence.py
    "grad_scale",  # checks/systematic.py
    "grad_scale_accumulation",  # cases/test_te_delayed.py
    "grad_scale_resolution",  # checks/systematic.py
    "gradient_volume",  # checks/collectives.py
    "inputs_left",  # checks/leftovers.py
    "memory_retained",  # checks/leftovers.py
    "nvfp4_stochastic_rounding",  # checks/nvfp4_sr.py
    "output_meta",  # checks/leftovers.py
    "output_parity",  # checks/state.py
    "params_after_steps",  # checks/training.py
    "parity_vs_te_eager",  # cases/test_te_fp8.py
    "process_state",  # checks/leftovers.py
    "replay",  # checks/replay.py
    "requires_grad_left",  # checks/leftovers.py
    "reshard_timing",  # checks/reshard.py
    "return_contract",  # checks/te_contract.py
    "saved_copies",  # checks/te_waste.py
    "state_left_behind",  # checks/state.py
    "te_compile_path",  # checks/te_compile.py
    "te_family_gemms",  # checks/te_family.py
    "te_saved_bytes",  # checks/te_waste.py
    "te_waste",  # checks/te_waste.py
    "waste_flops",  # checks/waste.py
    "waste_peak",  # checks/waste.py
    "waste_saved",  # checks/waste.py
)


def unknown_check_message(name: str) -> str:
    """"unknown check 'grad_parrity' (did you mean 'grad_parity'?); the checks that exist: ..."."""
    close = difflib.get_close_matches(name, CHECKS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown check {name!r}{hint}; the checks that exist: {', '.join(CHECKS)}"
