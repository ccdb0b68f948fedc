"""The record of the tex layer below TE's Python: every GEMM (layout, shapes, pass, operand provenance).

`TexRecorder` wraps the GEMM and quantize entry points of whichever `transformer_engine_torch` is loaded (the
CPU emulation, or TE's real C++ extension on a GPU), so both give the same fields. TE's Python looks these
functions up on the module at call time, so wrapping the module's attributes sees every call; nothing in
TE's Python can skip or fake the record.

Provenance: a GEMM operand is often an FP8 copy, not the tensor it came from. Every quantize maps the copy's
buffers to its source (and a dequantize its high-precision result to the same source), so an operand resolves to
a root: the parameter it was quantized from (layer known) or the activation it was made from (layer known by data
flow: the layer whose fprop consumed it).

Slices: a GEMM may run over part of a tensor (split-K: a K-slice of the weight, of the activation, or of their FP8
copies). A view that shares bytes of its storage with a tensor seen before (a registered parameter, a copy's
buffer, an earlier operand) resolves to that tensor's root, so the parts of one GEMM name the layer the whole
would. Overlap is judged on byte spans, which a strided view can over-state; tensors that interleave within one
storage (column blocks of one matrix) would then share a root, which no TE module passes to two layers.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from te_verify.te.tecpu import copy_layouts
from te_verify.te.tecpu.copy_layouts import CopySeen
from te_verify.te.tecpu.te_classes import shape_of

TEX_MODULE = "transformer_engine_torch"
# Argument names as TE 2.20's pybind.cpp declares them (py::arg), which TE's Python may pass by keyword.
GEMM_ARGS = ("A", "transA", "B", "transB", "D", "quantizer", "output_dtype", "bias", "bias_type", "gelu",
             "gelu_in", "grad", "workspace", "workspace_size", "accumulate", "use_split_accumulator")
# te_general_grouped_gemm has no py::arg names (positional only); these follow extensions.h's parameters
# (a 17th, math_sm_count, is not read).
GROUPED_ARGS = ("A", "transa", "B", "transb", "D", "D_type", "m_splits", "bias", "bias_type", "single_output",
                "pre_gelu_out", "grad", "workspace", "workspaceSize", "accumulate", "use_split_accumulator")
# GEMM paths this record does not split into per-GEMM events: TE 2.20's grouped-tensor path (taken by te.ops
# GroupedLinear in bf16/fp16 or FP8 current scaling on sm90+ with cuBLASLt >= 13.4, and by GroupedLinear with
# use_grouped_tensor=True: GEMMs over packed GroupedTensors and their group quantizers) and the userbuffers
# comm+GEMM overlap. A call is
# noted so the GEMM check fails naming it instead of under-counting. The emulation reports cuBLASLt 13.0 and has
# no userbuffers, so it never takes these paths (its strict shim would raise if it did).
UNMEASURED = ("te_general_grouped_gemm_for_grouped_tensor", "te_general_grouped_gemm_for_discrete_in",
              "te_general_grouped_gemm_for_discrete_out", "group_quantize", "bgrad_group_quantize",
              "group_requantize_inplace", "bulk_overlap_ag_with_external_gemm")
# TE's Python asks for each role in its own layout (y = x W^T, dx = dy W, dW = dy^T x); the `grad` flag only
# selects epilogues and callers differ on it (te.ops passes grad=False to its dgrad/wgrad grouped GEMMs).
ROLES_BY_LAYOUT = {"TN": "fprop", "NN": "dgrad", "NT": "wgrad"}

RootKey = tuple[Any, int, int]  # (storage identity, storage offset, numel): a tensor or a view of one


def patch_tex(saved: list[tuple[str, Callable]], wrappers: Iterable[tuple[str, Callable]]) -> None:
    """Replace each named tex function present with `wrap(original)`, remembering the original in `saved`."""
    tex = sys.modules.get(TEX_MODULE)
    for name, wrap in wrappers:
        original = getattr(tex, name, None) if tex is not None else None
        if original is not None:
            saved.append((name, original))
            setattr(tex, name, wrap(original))


def restore_tex(saved: list[tuple[str, Callable]]) -> None:
    """Put back what patch_tex replaced, last first."""
    tex = sys.modules.get(TEX_MODULE)
    while saved:
        name, original = saved.pop()
        setattr(tex, name, original)


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a view can touch, [first, last + 1) (a strided view skips some in between)."""
    size = t.element_size()
    start = t.storage_offset() * size
    if t.numel() == 0:
        return start, start
    return start, start + size * (1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride())))


def root_key(t: torch.Tensor) -> RootKey:
    """A key by data pointer: safe only while every keyed storage stays alive (the allocator reuses addresses).
    Probes pass a generation-safe storage identity instead (TexRecorder's `storage_key`)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())


@dataclass(frozen=True)
class TexGemm:
    """One GEMM at the tex boundary (a grouped call gives one per group)."""

    # "forward" or "backward" (set by the probe), and the pass: 0 forward, k the k-th backward.
    phase: str
    pass_index: int
    # tex entry point: "generic_gemm" or "te_general_grouped_gemm".
    op: str
    # "TN", "NN" or "NT", and whether TE asked for the gradient epilogues (grad=True).
    layout: str
    grad: bool
    # Output rows, output columns, reduction length.
    m: int
    n: int
    k: int
    # Whether the operands were FP8 tensors.
    fp8: bool
    # Whether the GEMM accumulated into its output (beta != 0), e.g. into main_grad.
    accumulate: bool
    # Provenance roots of A, B and the output D (None where D was allocated by the call).
    a_root: RootKey | None
    b_root: RootKey | None
    d_root: RootKey | None
    # Bytes of A and B as the GEMM reads them: their elements at one byte each when FP8, else their element size.
    operand_bytes: int = 0

    @property
    def role(self) -> str:
        return ROLES_BY_LAYOUT.get(self.layout, "unknown")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass
class TexRecord:
    """What one recorder saw."""

    gemms: list[TexGemm] = field(default_factory=list)
    # Buffer key of a quantized copy (or of a dequantized one) -> the root of the tensor it was quantized from.
    provenance: dict[RootKey, RootKey] = field(default_factory=dict)
    # Buffer key of a quantized copy -> bytes it holds (data, transpose and scale_inv).
    copy_bytes: dict[RootKey, int] = field(default_factory=dict)
    # tex entry points called that the record does not measure (UNMEASURED), in call order.
    unmeasured: list[str] = field(default_factory=list)
    # Buffer key of a quantized copy -> its layouts, their bytes and the GEMMs that read them (copy_layouts).
    copies: dict[RootKey, CopySeen] = field(default_factory=dict)


def quantized_buffers(q: Any) -> list[torch.Tensor]:
    """The plain tensors a quantized tensor holds (rowwise/columnwise data and scales; not a transpose marked
    invalid, which TE's C++ never reads)."""
    names = ("_data", "_transpose", "_scale_inv", "_rowwise_data", "_columnwise_data", "_rowwise_scale_inv",
             "_columnwise_scale_inv", "_amax_rowwise", "_amax_columnwise")
    if getattr(q, "_transpose_invalid", False):
        names = tuple(n for n in names if n != "_transpose")
    return [b for b in (getattr(q, n, None) for n in names) if isinstance(b, torch.Tensor)]


class TexRecorder:
    """Wraps the loaded tex module's entry points while entered; `phase` tags the events.

    `storage_key(t)` names a tensor's storage for provenance; by default its data pointer (root_key), which the
    allocator reuses once a storage is freed, so a run that frees tensors needs a generation-safe key (the
    probes pass the dispatch watcher's serials).
    """

    def __init__(self, storage_key: Callable[[torch.Tensor], Any] | None = None,
                 copied_from: Callable[[torch.Tensor], RootKey] | None = None) -> None:
        self.key = (lambda t: (storage_key(t), t.storage_offset(), t.numel())) if storage_key else root_key
        # The view a plain tensor was copied from by a torch op (a cast), in `key`'s terms; None: not followed.
        self.copied_from = copied_from
        self.record = TexRecord()
        self.phase, self.pass_index = "forward", 0
        self._saved: list[tuple[str, Callable]] = []
        # Storage identity -> (byte span, root) of the plain tensors seen (registered, copied from, or operands),
        # and of the quantized copies' buffers (the root being the buffer's own key): how a slice finds its whole.
        self._tensors: dict[Any, list[tuple[int, int, RootKey]]] = {}
        self._copies: dict[Any, list[tuple[int, int, RootKey]]] = {}

    def register(self, t: torch.Tensor) -> RootKey:
        """A tensor known whole before the run (a parameter, its main_grad): its root, which its slices share."""
        return self._whole(t)

    @staticmethod
    def _overlapping(regions: list[tuple[int, int, RootKey]], span: tuple[int, int]) -> RootKey | None:
        return next((root for start, end, root in regions if start < span[1] and span[0] < end), None)

    def _whole(self, t: torch.Tensor) -> RootKey:
        """The root of a plain tensor: its own key, or that of a tensor seen before whose bytes it shares."""
        key, span = self.key(t), byte_span(t)
        regions = self._tensors.setdefault(key[0], [])
        if any(root == key for *_, root in regions):
            return key
        found = self._overlapping(regions, span)
        if found is None:
            regions.append((*span, key))
        return key if found is None else found

    def root(self, t: Any) -> RootKey | None:
        """The provenance root of an operand: through quantized copies (or a slice of one) back to the source
        tensor; a plain tensor's (or a slice's) own root."""
        buffers = quantized_buffers(t) or ([t] if type(t) in (torch.Tensor, torch.nn.Parameter) else [])
        if not buffers:  # None, or a wrapper (e.g. a QuantizedTensor) holding no buffers: nothing to follow
            return None
        key, seen = self.key(buffers[0]), set()
        if key not in self.record.provenance:
            key = self._overlapping(self._copies.get(key[0], []), byte_span(buffers[0]))
            if key is None:
                return self._source(buffers[0])
        while key in self.record.provenance and key not in seen:
            seen.add(key)
            key = self.record.provenance[key]
        return key

    def _source(self, t: torch.Tensor) -> RootKey:
        """A plain tensor's root: what it was copied from by a torch op where copies are followed, else its own."""
        source = self.copied_from(t) if self.copied_from is not None else None
        return source if source is not None and source != self.key(t) else self._whole(t)

    def note_copy(self, source: torch.Tensor, copy: Any) -> None:
        """Map every buffer of a quantized copy to its source's root."""
        buffers, root = quantized_buffers(copy), self.root(source)
        self._map(buffers, root)
        self.record.copy_bytes[self.key(buffers[0])] = sum(b.numel() * b.element_size() for b in buffers)
        copy_layouts.note(self.record.copies, self.key(buffers[0]), copy, root, self.phase)

    def _map(self, buffers: list[torch.Tensor], source: RootKey | None) -> None:
        """A copy's buffers (and any slice of them) resolve to `source`."""
        for buf in buffers:
            key = self.key(buf)
            self.record.provenance[key] = source
            copies = self._copies.setdefault(key[0], [])
            if not any(root == key for *_, root in copies):
                copies.append((*byte_span(buf), key))

    def __enter__(self) -> "TexRecorder":
        patch_tex(self._saved, (("generic_gemm", self._wrap_gemm), ("te_general_grouped_gemm", self._wrap_grouped),
                                ("quantize", self._wrap_quantize), ("bgrad_quantize", self._wrap_bgrad_quantize),
                                ("split_quantize", self._wrap_split_quantize), ("dequantize", self._wrap_dequantize),
                                *((name, functools.partial(self._wrap_unmeasured, name)) for name in UNMEASURED)))
        return self

    def __exit__(self, *exc: object) -> None:
        restore_tex(self._saved)

    def _event(self, op: str, a: Any, transa: bool, b: Any, transb: bool, d: Any, grad: bool, accumulate: bool) -> TexGemm:
        a_rows, a_cols = _dims2(shape_of(a))
        b_rows, b_cols = _dims2(shape_of(b))
        m = b_cols if transb else b_rows
        n = a_rows if transa else a_cols
        k = a_cols if transa else a_rows
        fp8 = bool(quantized_buffers(a)) or bool(quantized_buffers(b))
        layout = ("T" if transa else "N") + ("T" if transb else "N")
        read = a_rows * a_cols * _element_bytes(a) + b_rows * b_cols * _element_bytes(b)
        for t, rowwise in ((a, transa), (b, not transb)):  # the layout each operand is read in
            if quantized_buffers(t):
                copy_layouts.note(self.record.copies, self.key(quantized_buffers(t)[0]), t, self.root(t), self.phase,
                                  (ROLES_BY_LAYOUT.get(layout, "unknown"), "rowwise" if rowwise else "columnwise"))
        return TexGemm(self.phase, self.pass_index, op, layout, bool(grad), m, n, k, fp8, bool(accumulate),
                       self.root(a), self.root(b), self.root(d) if isinstance(d, torch.Tensor) else None, read)

    def _wrap_gemm(self, original: Callable) -> Callable:
        def generic_gemm(*args: Any, **kwargs: Any):
            named = dict(zip(GEMM_ARGS, args), **kwargs)
            self.record.gemms.append(self._event("generic_gemm", named["A"], named["transA"], named["B"],
                                                 named["transB"], named["D"], named["grad"], named["accumulate"]))
            return original(*args, **kwargs)
        return generic_gemm

    def _wrap_grouped(self, original: Callable) -> Callable:
        def te_general_grouped_gemm(*args: Any, **kwargs: Any):
            named = dict(zip(GROUPED_ARGS, args), **kwargs)
            outs = named["D"] if named["D"] is not None and not named["single_output"] else [None] * len(named["A"])
            for a, b, d in zip(named["A"], named["B"], outs):
                if math.prod(shape_of(a)) and math.prod(shape_of(b)):  # TE's storages have no numel()
                    self.record.gemms.append(self._event("te_general_grouped_gemm", a, named["transa"], b,
                                                         named["transb"], d, named["grad"], named["accumulate"]))
            return original(*args, **kwargs)
        return te_general_grouped_gemm

    def _wrap_quantize(self, original: Callable) -> Callable:
        def quantize(tensor, quantizer, output=None, noop=None, *args: Any, **kwargs: Any):
            out = original(tensor, quantizer, output, noop, *args, **kwargs)
            if quantized_buffers(out):
                self.note_copy(tensor, out)
            return out
        return quantize

    def _wrap_split_quantize(self, original: Callable) -> Callable:
        def split_quantize(tensor, split_sections, quantizer_list, *args: Any, **kwargs: Any):
            outs = original(tensor, split_sections, quantizer_list, *args, **kwargs)
            for chunk, out in zip(torch.split(tensor, list(split_sections)), outs):
                if quantized_buffers(out):
                    self.note_copy(chunk, out)
            return outs
        return split_quantize

    def _wrap_bgrad_quantize(self, original: Callable) -> Callable:
        def bgrad_quantize(input, quantizer):  # noqa: A002 -- pybind's argument name
            grad_bias, out = original(input, quantizer)
            if quantized_buffers(out):
                self.note_copy(input, out)
            return [grad_bias, out]
        return bgrad_quantize

    def _wrap_dequantize(self, original: Callable) -> Callable:
        def dequantize(*args: Any, **kwargs: Any):
            named = dict(zip(("input", "otype"), args), **kwargs)
            out = original(*args, **kwargs)
            # a high-precision copy a GEMM may read
            if isinstance(out, torch.Tensor) and quantized_buffers(named["input"]):
                self._map([out], self.root(named["input"]))
            return out
        return dequantize

    def _wrap_unmeasured(self, name: str, original: Callable) -> Callable:
        def unmeasured(*args: Any, **kwargs: Any):
            self.record.unmeasured.append(name)
            return original(*args, **kwargs)
        return unmeasured


def _element_bytes(t: Any) -> int:
    """Bytes per element a GEMM reads of an operand: 1 for an FP8 copy (its data buffers), else its element size."""
    buffers = quantized_buffers(t)  # the data (or its transpose) first
    return buffers[0].element_size() if buffers else t.element_size()


def _dims2(shape: Any) -> tuple[int, int]:
    rows = 1
    for d in tuple(shape)[:-1]:
        rows *= d
    return rows, tuple(shape)[-1]
