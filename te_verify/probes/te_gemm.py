"""GEMMs and FLOPs of real TransformerEngine by phase and role: a counting wrapper around TE's GEMM entry points.

TE's modules run their GEMMs through `general_gemm` and `general_grouped_gemm`
(transformer_engine/pytorch/cpp_extensions/gemm.py) straight into cuBLAS, so the dispatch-mode GemmProbe never
sees them. The modules bind those names at import (`from ..cpp_extensions import general_gemm` in
module/linear.py, layernorm_linear.py, layernorm_mlp.py, grouped_linear.py) and look them up in their own
globals at call time, so the probe replaces the function in every loaded module that binds it, and puts the
originals back on exit.

Roles come from the `layout` argument, as module/linear.py passes it: fprop "TN" (y = x W^T, the default),
dgrad "NN" (dx = dy W, grad=True), wgrad "NT" (dW = dy^T x, grad=True); any other combination is "unknown".
Layers are not attributed (the operands are FP8 copies, not the parameters), so `layer` is always None.
FLOPs: 2*m*n*k with (m, n, k) from the operand shapes and the layout (`gemm_dims`). Only the outermost call
counts: general_grouped_gemm may loop over general_gemm, and that inner call is the same GEMM.
`general_grouped_gemm_for_grouped_tensor` (GroupedLinear's grouped-tensor path) is not wrapped.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import sys
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

GEMM_MODULE = "transformer_engine.pytorch.cpp_extensions.gemm"
ENTRY_POINTS = ("general_gemm", "general_grouped_gemm")
ROLES_BY_LAYOUT = {("TN", False): "fprop", ("NN", True): "dgrad", ("NT", True): "wgrad"}


@dataclass(frozen=True)
class TEGemmEvent:
    """One GEMM TE ran (a grouped call gives one event per group)."""

    # "forward" or "backward".
    phase: str
    # 0 for the forward, k for the k-th backward pass.
    pass_index: int
    # "fprop", "dgrad", "wgrad" or "unknown".
    role: str
    # Always None: TE's operands are quantized copies, not the parameters (see the module docstring).
    layer: int | None
    # Entry point name, e.g. "general_gemm".
    op: str
    # Output rows, output columns, reduction length.
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def _rows_cols(t: Any) -> tuple[int, int]:
    """A GEMM operand as the 2-D matrix TE sees: leading dims flattened."""
    shape = tuple(t.shape)
    return math.prod(shape[:-1]), shape[-1]


def gemm_dims(a: Any, b: Any, layout: str) -> tuple[int, int, int]:
    """(m, n, k) of TE's out = op(B) @ op(A)^T-style GEMM: "TN" out[rows(B), rows(A)], k = cols(A);
    "NN" out[rows(B), cols(A)], k = rows(A); "NT" out[cols(B), cols(A)], k = rows(A)."""
    (a_rows, a_cols), (b_rows, b_cols) = _rows_cols(a), _rows_cols(b)
    transa, transb = layout[0] == "T", layout[1] == "T"
    m = b_cols if transb else b_rows
    n = a_rows if transa else a_cols
    k = a_cols if transa else a_rows
    return m, n, k


def role_of(layout: str, grad: bool) -> str:
    return ROLES_BY_LAYOUT.get((layout, bool(grad)), "unknown")


class TEGemmProbe:
    """Counts TE's GEMMs by phase, role and FLOPs while entered; inactive unless real TE is the active impl.

    `source`: the module holding the original entry points (default: TE's cpp_extensions.gemm, imported only
    when `te_api.active().name == "transformer_engine"`); tests pass a stand-in with the same signatures.
    """

    name = "te_gemm"

    def __init__(self, source: ModuleType | None = None) -> None:
        self.source = source
        self.events: list[TEGemmEvent] = []
        self.inactive_reason: str | None = None
        self._phase, self._pass = "forward", 0
        self._depth = 0  # > 0 inside a counted call
        self._patched: list[tuple[ModuleType, str, Callable]] = []

    def _resolve_source(self) -> ModuleType | None:
        if self.source is not None:
            return self.source
        from te_verify import te_api

        impl = te_api.active()
        if impl.name != "transformer_engine":
            self.inactive_reason = f"--te-impl {impl.name}: not real transformer_engine"
            return None
        return importlib.import_module(GEMM_MODULE)

    def __enter__(self) -> "TEGemmProbe":
        self.events, self.inactive_reason = [], None
        source = self._resolve_source()
        for entry in ENTRY_POINTS if source is not None else ():
            original = getattr(source, entry, None)
            if original is not None:
                self._patch_everywhere(original, self._wrap(entry, original))
        return self

    def _patch_everywhere(self, original: Callable, wrapper: Callable) -> None:
        """Rebind `original` in every loaded module whose globals hold it (the modules look it up at call time)."""
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                if value is original:
                    self._patched.append((module, attr, original))
                    setattr(module, attr, wrapper)

    def __exit__(self, *exc: object) -> None:
        while self._patched:
            module, attr, original = self._patched.pop()
            setattr(module, attr, original)

    def phase(self, name: str, index: int = 0) -> None:
        if name != "idle":
            self._phase, self._pass = name, index

    def _wrap(self, entry: str, original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if self._depth == 0:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                self._record(entry, bound.arguments)
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def _record(self, entry: str, arguments: dict[str, Any]) -> None:
        layout, grad = arguments["layout"], arguments["grad"]
        pairs = zip(arguments["A"], arguments["B"]) if entry == "general_grouped_gemm" else [(arguments["A"], arguments["B"])]
        for a, b in pairs:
            m, n, k = gemm_dims(a, b, layout)
            self.events.append(TEGemmEvent(self._phase, self._pass, role_of(layout, grad), None, entry, m, n, k))

    def figures(self) -> dict[str, Any]:
        if self.inactive_reason is not None:
            return {"te_gemm_probe": f"inactive: {self.inactive_reason}"}
        forward = sum(e.flops for e in self.events if e.phase == "forward")
        total = sum(e.flops for e in self.events)
        return {
            "te_gemm_flops": total,
            "te_gemm_flops_forward": forward,
            "te_gemm_flops_backward": total - forward,
            "te_gemm_count": len(self.events),
            "te_gemms_by_role": dict(Counter(e.role for e in self.events)),
            "te_gemms_by_pass_role": {f"{p}.{r}": c for (p, r), c in
                                      sorted(Counter((e.pass_index, e.role) for e in self.events).items())},
        }

    def observations(self) -> dict[str, Any]:
        return {"te_gemm_events": list(self.events)}
