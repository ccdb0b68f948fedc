"""The GEMM site of each FP8 quantization, from the GEMMs at the tex boundary that read it.

A site is the logical place of a quantization in the model: the weight of the GEMM and the operand's role there
("0.weight's input", "0.weight's weight", "0.weight's grad_output"). It is found from data flow alone, never from
the backend's objects (module names, fp8_meta, recipe states), so a backend that gives a site a new scaling state
cannot give it a new site too:
- the role comes from the layout TE asks of tex (fprop "TN": A the weight, B the input; dgrad "NN": A the weight, B
  the grad_output; wgrad "NT": A the input, B the grad_output; tecpu.record.ROLES_BY_LAYOUT);
- the weight comes from the parameter whose storage a quantization read (the observer's `source`), and a wgrad's
  from its input's site, found at that input's fprop.
A quantization no GEMM read as an operand (an output or grad_input quantizer, a cast fused into another kernel)
or whose GEMM's weight copy was not seen quantized has no site: the check counts those.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from te_verify.te.tecpu.record import GEMM_ARGS, GROUPED_ARGS, ROLES_BY_LAYOUT, quantized_buffers

# Which operand of each GEMM role holds the weight (or, for wgrad, the input whose site names the weight), and the
# role of each operand.
ROLES = {"fprop": ("weight", "input"), "dgrad": ("weight", "grad_output"), "wgrad": ("input", "grad_output")}


class GemmSites:
    """Remembers which quantization made each FP8 tensor (by object, held weakly) and names its site when a GEMM
    reads it. `source(i)` is the parameter name the i-th quantization read, or None."""

    def __init__(self, source: Callable[[int], str | None]) -> None:
        self._source = source
        # id of a quantized tensor or of one of its buffers -> (weak reference to it, quantization index).
        self._made: dict[int, tuple[weakref.ref, int]] = {}
        # Quantization index -> (weight parameter name, role).
        self.sites: dict[int, tuple[str, str]] = {}

    def note(self, index: int, out: Any) -> None:
        """The `index`-th quantization made `out`: its wrapper and buffers (a saved copy may keep only the
        columnwise buffer, or be rewrapped) lead back to it."""
        for obj in (out, *quantized_buffers(out)):
            try:
                self._made[id(obj)] = (weakref.ref(obj), index)
            except TypeError:  # an object without weak references: its buffers still name it
                continue

    def _made_by(self, operand: Any) -> int | None:
        for obj in (operand, *quantized_buffers(operand)):
            entry = self._made.get(id(obj))
            if entry is not None and entry[0]() is obj:  # not another object at a freed one's id
                return entry[1]
        return None

    def gemm(self, a: Any, transa: bool, b: Any, transb: bool) -> None:
        """A GEMM read `a` and `b` in the layout (transa, transb): name its operands' sites."""
        role = ROLES_BY_LAYOUT.get(("T" if transa else "N") + ("T" if transb else "N"))
        if role not in ROLES:
            return
        qa, qb = self._made_by(a), self._made_by(b)
        if role == "wgrad":
            weight = self.sites.get(qa, (None,))[0] if qa is not None else None
        else:
            weight = self._source(qa) if qa is not None else None
        if weight is None:
            return
        for q, operand_role in zip((qa, qb), ROLES[role]):
            if q is not None:
                self.sites.setdefault(q, (weight, operand_role))

    def wrappers(self) -> tuple[tuple[str, Callable[[Callable], Callable]], ...]:
        """(tex function name, wrap(original)) for patch_tex over tex's GEMM entry points."""

        def wrap_gemm(original: Callable) -> Callable:
            def generic_gemm(*args: Any, **kwargs: Any):
                named = dict(zip(GEMM_ARGS, args), **kwargs)
                self.gemm(named["A"], named["transA"], named["B"], named["transB"])
                return original(*args, **kwargs)
            return generic_gemm

        def wrap_grouped(original: Callable) -> Callable:
            def te_general_grouped_gemm(*args: Any, **kwargs: Any):
                named = dict(zip(GROUPED_ARGS, args), **kwargs)
                for a, b in zip(named["A"], named["B"]):
                    self.gemm(a, named["transa"], b, named["transb"])
                return original(*args, **kwargs)
            return te_general_grouped_gemm

        return (("generic_gemm", wrap_gemm), ("te_general_grouped_gemm", wrap_grouped))


def site_label(site: tuple[str, str]) -> str:
    """("0.weight", "input") -> "0.weight's input"."""
    return f"{site[0]}'s {site[1]}"
