"""The reference's GEMM log: every GEMM (layer, role, phase, shapes, FLOPs) and every saved-for-backward tensor.

A log is active only while a collector is entered (the probe does that); GEMMs outside any collector
are computed but not recorded.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import torch

ROLES = ("fprop", "dgrad", "wgrad", "bgrad")  # bgrad is a column reduction, logged alongside


@dataclass(frozen=True)
class GemmEvent:
    """One GEMM C[m, n] = A[m, k] @ B[k, n]."""

    # Layer label (the module's name in the model, e.g. "0"; "0.g1" for group 1 of a grouped layer).
    layer: str
    # "fprop", "dgrad", "wgrad" or "bgrad" (the bias reduction: m=1, n=features, k=rows).
    role: str
    # Phase set by the probe: "forward", "backward1", "backward2", ... (or "" outside a probe phase).
    phase: str
    # Output rows, output columns, reduction length.
    m: int
    n: int
    k: int
    # Whether the operands were FP8-quantized.
    fp8: bool

    @property
    def flops(self) -> int:
        return self.m * self.n * self.k if self.role == "bgrad" else 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class SavedEvent:
    """One tensor a layer kept for its backward."""

    # Layer label, as in GemmEvent.
    layer: str
    # "input" (for wgrad) or "weight" (for dgrad).
    kind: str
    # Bytes of new storage (0 when it is the caller's own tensor, kept by reference).
    bytes: int
    # Whether it is an FP8 copy.
    fp8: bool
    # Phase in which it was saved.
    phase: str


@dataclass
class GemmLog:
    """Events collected while a collector is active."""

    # GEMMs in execution order.
    gemms: list[GemmEvent] = field(default_factory=list)
    # Saved-for-backward tensors in execution order.
    saved: list[SavedEvent] = field(default_factory=list)
    # Current phase label, set by the probe.
    phase: str = ""


_ACTIVE: list[GemmLog] = []


@contextlib.contextmanager
def collecting(log: GemmLog | None = None) -> Iterator[GemmLog]:
    log = log if log is not None else GemmLog()
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


def _phase() -> str:
    return _ACTIVE[-1].phase if _ACTIVE else ""


# The dtype GEMMs, FP8 operands and bias reductions are computed in: fp32, as TE's GEMMs accumulate, or fp64 for the
# truth FP8 gradients are bounded by (te_verify.checks.fp8_tolerance): the same quantized operands, exact arithmetic.
_ACCUMULATE: list[torch.dtype] = [torch.float32]


def accumulation_dtype() -> torch.dtype:
    return _ACCUMULATE[-1]


@contextlib.contextmanager
def accumulating(dtype: torch.dtype) -> Iterator[None]:
    """Compute the reference's GEMMs, FP8 operands and bias gradients in `dtype` inside the block."""
    _ACCUMULATE.append(dtype)
    try:
        yield
    finally:
        _ACCUMULATE.pop()


class Operand(NamedTuple):
    """A GEMM operand: its values, and the per-tensor factor the GEMM scales its sum by (None: no factor)."""

    values: torch.Tensor
    factor: torch.Tensor | None = None

    def t(self) -> "Operand":
        return Operand(self.values.t(), self.factor)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def fp8_operand(data: torch.Tensor, scale_inv: torch.Tensor) -> Operand:
    """An FP8 copy as TE's GEMM reads it, in the accumulation dtype. A per-tensor copy (0-d scale_inv): its FP8
    values (exact in fp32), the scale_inv left as the factor of the sum, as cuBLAS's FP8 GEMM scales the fp32 sum of
    FP8 products by scale_inv_A x scale_inv_B (TE's definition; the tex emulation's gemm.product). Dequantizing each
    operand first rounds each element once more: with a scale that is no power of 2 (current scaling; delayed
    scaling after its first update) the sums differ in fp32's last bit, and under torch.autocast that flips bf16
    roundings, then FP8 ones downstream. A block-scaled copy (per-element scales): values times their scales."""
    dtype = accumulation_dtype()
    if scale_inv.dim() == 0:
        return Operand(data.to(dtype), scale_inv.to(dtype))
    return Operand(data.to(dtype) * scale_inv.to(dtype))


def gemm(layer: str, role: str, a: torch.Tensor, b: torch.Tensor, fp8: bool) -> torch.Tensor:
    """a @ b in the accumulation dtype (fp32 unless `accumulating` says otherwise), logged with its layer and role."""
    assert role in ROLES[:3], role
    event = GemmEvent(layer, role, _phase(), a.shape[0], b.shape[1], a.shape[1], fp8)
    for log in _ACTIVE:
        log.gemms.append(event)
    dtype = accumulation_dtype()
    return a.to(dtype) @ b.to(dtype)


def bias_grad(layer: str, g2d: torch.Tensor) -> torch.Tensor:
    """The bias gradient (sum over rows), logged as a "bgrad" event."""
    event = GemmEvent(layer, "bgrad", _phase(), 1, g2d.shape[1], g2d.shape[0], False)
    for log in _ACTIVE:
        log.gemms.append(event)
    return g2d.to(accumulation_dtype()).sum(0)


def log_saved(layer: str, kind: str, nbytes: int, fp8: bool) -> None:
    event = SavedEvent(layer, kind, nbytes, fp8, _phase())
    for log in _ACTIVE:
        log.saved.append(event)
