"""One backend under two option sets on the same spec: differences in saved bytes, saved count and peak.

This is how a change such as thunder's joint-trace split (seed 003: 58,448 MiB / 775 saved tensors before,
62,988 MiB / 712 after) is judged before it lands: run both, report both, flag a rise beyond `max_rise`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from te_verify.backends.base import Backend
from te_verify.backends.thunder import ThunderBackend
from te_verify.backends.torch_compile import TorchCompileBackend
from te_verify.checks.verdict import Verdict
from te_verify.probes import default_probes
from te_verify.run.runner import run_case
from te_verify.spec import CaseSpec

COMPARED = ("saved_bytes_actual", "saved_count_actual", "peak_bytes")


class ThunderWithOptions(ThunderBackend):
    """thunder.jit with explicit keyword options (executors list, compile options)."""

    def __init__(self, label: str, **options: Any) -> None:
        self.name = f"thunder[{label}]"
        self.options = options  # keyword arguments passed to thunder.jit

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        from te_verify.compat.thunder import import_thunder

        return import_thunder().jit(model, **self.options)


# backend name -> (baseline, candidate) factories; the candidate's rise over the baseline is what is judged.
OPTION_SETS: dict[str, tuple[Callable[[], Backend], Callable[[], Backend]]] = {
    "thunder": (lambda: ThunderWithOptions("default"), lambda: ThunderWithOptions("executors=torch", executors=["torch"])),
    "torch_compile": (lambda: TorchCompileBackend("aot_eager"), lambda: TorchCompileBackend("aot_eager_decomp_partition")),
}


def rise(base: float, new: float) -> float | None:
    """Relative rise of `new` over `base`; None for a rise from zero."""
    if base == 0:
        return 0.0 if new == 0 else None
    return round((new - base) / base, 4)


def compare_figures(base: dict, new: dict) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for key in COMPARED:
        figures[f"{key}_base"], figures[f"{key}_new"] = base.get(key, 0), new.get(key, 0)
        figures[f"{key}_rise"] = rise(figures[f"{key}_base"], figures[f"{key}_new"])
    return figures


def compare_options(spec: CaseSpec, backend_name: str, max_rise: float) -> Verdict:
    """Run `spec` under both option sets of `backend_name`; fail when a figure rises more than `max_rise`."""
    if backend_name not in OPTION_SETS:
        raise ValueError(f"backend {backend_name!r}: no option sets to compare; known: {', '.join(OPTION_SETS)}")
    base_backend, new_backend = (factory() for factory in OPTION_SETS[backend_name])
    base = run_case(spec, base_backend, default_probes(base_backend.name))
    new = run_case(spec, new_backend, default_probes(new_backend.name))
    for record in (base, new):
        if record.error is not None and record.error_pass == 0:
            return Verdict("compare_options", False, f"{spec.id} [{record.backend}]: run failed: {record.error!r}")
    figures = compare_figures(base.figures, new.figures)
    figures["compare_pair"] = f"{base_backend.name} -> {new_backend.name}"
    too_high = [f"{key} {figures[f'{key}_base']:,} -> {figures[f'{key}_new']:,} (rise {figures[f'{key}_rise']})"
                for key in COMPARED if figures[f"{key}_rise"] is None or figures[f"{key}_rise"] > max_rise]
    message = "" if not too_high else (f"{spec.id} [{figures['compare_pair']}]: rise over --max-rise "
                                       f"{max_rise}: " + "; ".join(too_high))
    return Verdict("compare_options", not too_high, message, figures)
