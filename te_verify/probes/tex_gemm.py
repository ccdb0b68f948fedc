"""GEMMs of TE's Python layer, read at the tex boundary below it (te_verify.te.tecpu.record), by layer and role.

Works the same over the tex emulation and over TE's real C++ extension on a GPU. Roles come from the layout TE
asks for (fprop "TN", dgrad "NN" and wgrad "NT" with grad=True). Layers come from provenance, not from TE:
an fprop or dgrad GEMM's A operand is (a copy of) a parameter, which names its layer; a wgrad GEMM's A operand
is (a copy of) an activation, whose layer is the one whose fprop consumed it (or its output is the
parameter's main_grad). An operand that is a slice of one of these (split-K) has its root (tecpu.record). A GEMM
that cannot be attributed keeps layer "?" and the check says so.
"""
from __future__ import annotations

import sys
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from te_verify.probes import dispatch
from te_verify.probes.flops import GemmProbe
from te_verify.te.tecpu.record import TEX_MODULE, RootKey, TexGemm, TexRecorder, patch_tex, restore_tex


@dataclass(frozen=True)
class LayerGemm:
    """A tex GEMM with the layer it belongs to."""

    # Layer label (the module name of its parameter, e.g. "0"), or "?" when it cannot be attributed.
    layer: str
    # "fprop", "dgrad", "wgrad" or "unknown".
    role: str
    # "forward" or "backward<k>".
    phase: str
    # The raw record.
    gemm: TexGemm

    @property
    def flops(self) -> int:
        return self.gemm.flops

    @property
    def operand_bytes(self) -> int:
        return self.gemm.operand_bytes

    @property
    def pass_index(self) -> int:
        """The index of the phase it ran in (a microbatch's, where a runner labels them: run.microbatch)."""
        return self.gemm.pass_index


def layer_of(param_name: str) -> str:
    """"0.weight" -> "0"; "layers.3.weight0" -> "layers.3"."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


def attribute(gemms: list[TexGemm], param_layers: dict[RootKey, str],
              input_layers: dict[RootKey, str] | None = None) -> list[LayerGemm]:
    """Each GEMM with its layer, by provenance and data flow (see the module docstring); fills `input_layers`
    (an activation's root -> the layer whose fprop consumed it) when given."""
    input_layers = {} if input_layers is None else input_layers
    attributed = []
    for g in gemms:
        layer = None
        if g.role in ("fprop", "dgrad"):
            layer = param_layers.get(g.a_root)
            if g.role == "fprop" and layer is not None and g.b_root is not None:
                input_layers[g.b_root] = layer
        elif g.role == "wgrad":
            layer = input_layers.get(g.a_root) or param_layers.get(g.d_root)
        phase = g.phase if g.phase == "forward" else f"{g.phase}{g.pass_index}"
        attributed.append(LayerGemm(layer or "?", g.role, phase, g))
    return attributed


class TexGemmProbe:
    """Records the tex layer's GEMMs while entered; `bind(model)` names the parameters' layers.

    Storages are named by the shared dispatch watcher (serials for storages made during the run), so provenance
    and the saved-tensor probe's keys agree and a freed address reused later is never mistaken for its old owner.
    """

    name = "tex_gemm"

    def __init__(self, follow_copies: bool = False) -> None:
        self.recorder = TexRecorder()
        self.param_layers: dict[RootKey, str] = {}
        self._model: torch.nn.Module | None = None
        # Operands that are aten copies (TE's casts under torch.autocast) lead back to what they copy
        # (watcher.Watcher.follow_copies), as TE's own quantized copies do through the tex record.
        self.follow_copies = follow_copies

    def again(self) -> "TexGemmProbe":
        """A fresh probe for a later iteration (the runner binds it)."""
        return TexGemmProbe(self.follow_copies)

    def bind(self, model: torch.nn.Module) -> None:
        self._model = model

    def __enter__(self) -> "TexGemmProbe":
        watcher = dispatch.subscribe(self)
        watcher.follow_copies |= self.follow_copies
        self.recorder = TexRecorder(storage_key=watcher.key,
                                    copied_from=watcher.root_view if self.follow_copies else None)
        for name, p in self._model.named_parameters() if self._model is not None else ():
            self.param_layers[self.recorder.register(p)] = layer_of(name)
            if isinstance(getattr(p, "main_grad", None), torch.Tensor):
                self.param_layers[self.recorder.register(p.main_grad)] = layer_of(name)
        self.recorder.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.recorder.__exit__(*exc)
        dispatch.unsubscribe(self)

    def phase(self, name: str, index: int = 0) -> None:
        dispatch.set_phase(name)
        if name != "idle":
            self.recorder.phase, self.recorder.pass_index = name, index

    @property
    def events(self) -> list[LayerGemm]:
        return attribute(self.recorder.record.gemms, self.param_layers)

    def figures(self) -> dict[str, Any]:
        events = self.events
        forward = [e for e in events if e.phase == "forward"]
        return {
            "tex_gemm_count": len(events),
            "tex_gemm_flops": sum(e.flops for e in events),
            "tex_gemms_by_role": dict(sorted(Counter(e.role for e in events).items())),
            "tex_gemms_fp8": sum(e.gemm.fp8 for e in events),
            "te_layers_claimed": sorted({e.layer for e in forward if e.role == "fprop"}),
            "tex_gemms_unattributed": sum(e.layer == "?" for e in events),
            "tex_calls_unmeasured": sorted(set(self.recorder.record.unmeasured)),
        }

    def observations(self) -> dict[str, Any]:
        input_layers: dict[RootKey, str] = {}
        events = attribute(self.recorder.record.gemms, self.param_layers, input_layers)
        return {"gemm_log": events, "tex_record": self.recorder.record, "param_layers": dict(self.param_layers),
                "input_layers": input_layers}


# TE's Python functions that build a process-wide constant once (functools.lru_cache) with an aten GEMM: TE 2.20's
# NVFP4 random Hadamard matrix (tensor/nvfp4_tensor.py get_rht_matrix: sign_matrix @ H16), built by the first
# NVFP4Quantizer of a process. Only the first case of a process would run it, so judging it would make a verdict
# depend on which case ran before: its GEMMs are counted (aten_gemms_te_constants), not given to the sites.
TE_CONSTANT_BUILDERS = (("transformer_engine.pytorch.tensor.nvfp4_tensor", "get_rht_matrix"),)


def tex_functions() -> list[str]:
    """The loaded tex module's functions (its kernels' entry points; not its classes, enums, or the stand-ins for what
    the emulation lacks, which raise when called)."""
    tex = sys.modules.get(TEX_MODULE)
    kinds = (types.FunctionType, types.BuiltinFunctionType)
    return [name for name, f in vars(tex).items() if isinstance(f, kinds)] if tex is not None else []


class AtenGemmOutsideTex(GemmProbe):
    """aten GEMMs (probes.flops.GemmProbe) that ran outside any tex call, with their sites' labels: the torch
    Linears of a model mixing them with TE modules (LoRA adapters over TE bases). The tex emulation computes with
    aten ops (its GEMMs, and a quantize's random Hadamard transform); on a GPU that is kernels' work, and its GEMMs
    belong to the tex record, so every tex call's aten GEMMs are left out here. So are those of TE's process-wide
    constants (TE_CONSTANT_BUILDERS), counted apart. Layers are every linear module (torch's or TE's Linear) in
    module order, named by qualified name: the oracle's sites. Enter it after a TexGemmProbe (its wrappers go on top
    of the recorder's and come off first)."""

    name = "aten_gemm_outside_tex"

    def __init__(self) -> None:
        # Copies followed: thunder feeds a convolution's weight gradient (LitGPT's fused-qkv lora_B) a layout copy
        # of the site's input.
        super().__init__(follow_copies=True)
        self.labels: list[str] = []
        self._depth = 0  # tex calls (or constant builders) in progress
        self._constant_depth = 0  # TE_CONSTANT_BUILDERS calls in progress
        self.constant_gemms = 0  # aten GEMMs run inside them
        self._saved: list[tuple[str, Any]] = []
        self._saved_builders: list[tuple[Any, str, Any]] = []

    def again(self) -> "AtenGemmOutsideTex":
        return AtenGemmOutsideTex()

    def bind(self, model: torch.nn.Module) -> None:
        from te_verify.oracle.sites import linear_weights

        named = linear_weights(model)
        self.labels, self._weights = [site.label for site in named], [site.weight for site in named]

    def _wrap(self, original: Any, constant: bool = False) -> Any:
        def inside(*args: Any, **kwargs: Any):
            self._depth += 1
            self._constant_depth += int(constant)
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
                self._constant_depth -= int(constant)
        return inside

    def __enter__(self) -> "AtenGemmOutsideTex":
        super().__enter__()
        self.constant_gemms = 0
        patch_tex(self._saved, ((name, self._wrap) for name in tex_functions()))
        for module_name, attr in TE_CONSTANT_BUILDERS:
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, attr):
                self._saved_builders.append((module, attr, getattr(module, attr)))
                setattr(module, attr, self._wrap(getattr(module, attr), constant=True))
        return self

    def __exit__(self, *exc: object) -> None:
        while self._saved_builders:
            module, attr, original = self._saved_builders.pop()
            setattr(module, attr, original)
        restore_tex(self._saved)
        super().__exit__(*exc)

    def _on_gemm(self, func: Any, operands: tuple, out: torch.Tensor, flops: int) -> None:
        if self._constant_depth:
            self.constant_gemms += 1
        elif not self._depth:
            super()._on_gemm(func, operands, out, flops)

    def figures(self) -> dict[str, Any]:
        return {"aten_gemm_count_outside_tex": len(self.events), "aten_gemms_te_constants": self.constant_gemms}

    def observations(self) -> dict[str, Any]:
        return {"aten_gemm_events": list(self.events), "aten_gemm_labels": list(self.labels)}
