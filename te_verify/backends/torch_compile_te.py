"""torch_compile_te: TE's modules of the active --te-impl (te_eager's converter) under torch.compile, TE's autocast
entered around the compiled call as users write it. `torch_compile_te` compiles with aot_eager,
`torch_compile_te_inductor` with inductor.

TE 2.20 ships a torch.compile path for te.Linear: a custom op (`transformer_engine_compile::linear`, with its
backward op) that Dynamo puts in the graph, and an eager fallback behind a graph break, with TE's reason, for what
the op cannot express (te_verify.te.compile_path has the table). What happened is read from the compiler, not from TE:
every graph Dynamo hands the backend is searched for TE's op, by layer (CompileLog), and Dynamo's graph-break record
during this callable's calls carries TE's fallback reason (TE breaks with `torch._dynamo.graph_break(msg="te.Linear
falling back to eager: <reason>")`). checks.te_compile judges it.

The tex emulation stands in for TE's C++ extension, which Dynamo cannot trace: a call into it graph-breaks and runs
eagerly. Dynamo would trace the emulation's Python instead (and the tex record's wrappers, at trace time, on fake
tensors), so its modules go on Dynamo's skip list (`tex_opaque_to_dynamo`): they run as a C++ extension would.
"""
from __future__ import annotations

import contextlib
import re
import warnings
from collections import Counter
from typing import Any, Callable, Iterator

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from te_verify.te import api as te_api
from te_verify.backends.te_eager import (KINDS, TEEagerBackend, TEFamily, TEStack, attach_main_grad, convert,
                                        convert_family)
from te_verify.spec import MLP_MODULES, NORM_MODULES, CaseSpec, TEConfig
from te_verify.te.compile_path import te_disabled_reason

# The backends of this module: name -> torch.compile backend each inspected graph is handed to.
BACKENDS = {"torch_compile_te": "aot_eager", "torch_compile_te_inductor": "inductor"}
TE_OP = "transformer_engine_compile.linear"  # TE's forward custom op as Dynamo's graph names it
# Where the tex emulation's functions and the tex record's wrappers live: opaque to Dynamo, as C++ is.
TEX_MODULES = ("te_verify.te.tecpu.tex", "te_verify.te.tecpu.gemm", "te_verify.te.tecpu.quantize",
               "te_verify.te.tecpu.block_quantize", "te_verify.te.tecpu.block_fp8", "te_verify.te.tecpu.block_scales",
               "te_verify.te.tecpu.block_storage", "te_verify.te.tecpu.mxfp8", "te_verify.te.tecpu.nvfp4",
               "te_verify.te.tecpu.strict", "te_verify.te.tecpu.record", "te_verify.probes.tex_gemm",
               "te_verify.probes.fp8_scaling")
_TE_BREAK = re.compile(r"te\.Linear falling back to eager: ([^\n]*)")
_DISABLED = re.compile(r"Skip (?:calling|inlining) function `?<function ([\w.<>]+) at")
_OPAQUE_DONE: list[str] = []


def tex_opaque_to_dynamo() -> None:
    """Dynamo skips the tex emulation's modules (a call into one graph-breaks and runs eagerly), once per process."""
    from torch._dynamo import trace_rules

    for name in TEX_MODULES:
        if name not in _OPAQUE_DONE:
            trace_rules.add(name)
            _OPAQUE_DONE.append(name)


def short_break(reason: str) -> str:
    """A graph-break record in a few words: TE's fallback reason, the disabled function, or its first line."""
    te = _TE_BREAK.search(reason)
    if te:
        return f"te.Linear falling back to eager: {te.group(1).strip()}"
    disabled = _DISABLED.search(reason)
    return f"{disabled.group(1)} is torch.compiler.disable()d" if disabled else reason.splitlines()[0][:200]


class CompileLog:
    """What torch.compile did with one prepared callable: the graphs Dynamo compiled and TE's op in them by layer,
    Dynamo's graph breaks during its calls, TE's warnings, and how the caller passed is_first_microbatch."""

    def __init__(self, te_modules: dict[str, tuple[str, bool]]) -> None:
        # Qualified name in the compiled module -> (layer label, whether it is a te.Linear) for every TE module.
        self.te_modules = te_modules
        # Dynamo graphs compiled for this callable (each one the backend received).
        self.graphs = 0
        # Layer label -> calls of TE's custom op found in those graphs.
        self.ops: Counter = Counter()
        # Short graph-break reason (short_break) -> how often Dynamo recorded it during this callable's calls.
        self.breaks: Counter = Counter()
        # TE's warnings (first line) raised during this callable's calls.
        self.warnings: list[str] = []
        # is_first_microbatch values the caller passed (None: not passed).
        self.first_microbatch: set = set()
        # Calls of the callable.
        self.calls = 0

    def backend(self, compile_graph: Callable) -> Callable:
        """A torch.compile backend: records the graph's TE ops by layer, then compiles it with `compile_graph`."""
        def inspect(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            self.graphs += 1
            for node in gm.graph.nodes:
                if node.op == "call_function" and str(node.target) in (TE_OP, f"{TE_OP}.default"):
                    self.ops[self._layer_of(node)] += 1
            return compile_graph(gm, example_inputs)
        return inspect

    def _layer_of(self, node: torch.fx.Node) -> str:
        """The layer label of a TE op node, from Dynamo's module stack ("L['self'].layers.0" -> "layers.0")."""
        for path, _ in reversed(list((node.meta.get("nn_module_stack") or {}).values())):
            qualname = re.sub(r"^L\['[^']*'\]\.?", "", str(path))
            if qualname in self.te_modules:
                return self.te_modules[qualname][0]
        return "?"

    @contextlib.contextmanager
    def watching(self, first_microbatch: bool | None) -> Iterator[None]:
        """Around one call: Dynamo's graph breaks and TE's warnings during it (warnings passed on afterwards)."""
        self.calls += 1
        self.first_microbatch.add(first_microbatch)
        before = Counter(counters["graph_break"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                for reason, n in (Counter(counters["graph_break"]) - before).items():
                    self.breaks[short_break(reason)] += n
        for w in caught:
            text = str(w.message).splitlines()[0][:300]
            if ("Transformer Engine" in text or "Falling back" in text) and text not in self.warnings:
                self.warnings.append(text)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def layers(self) -> tuple[list[str], list[str]]:
        """(layers whose TE op Dynamo compiled, TE layers that ran otherwise), in module order."""
        labels = [label for label, _ in self.te_modules.values()]
        return [l for l in labels if self.ops[l]], [l for l in labels if not self.ops[l]]

    def te_reasons(self) -> list[str]:
        """TE's words for a fallback: its graph-break messages, the functions it disabled, its import-time reason."""
        reasons = [b.split(": ", 1)[1] for b in self.breaks if b.startswith("te.Linear falling back")]
        reasons += [b for b in self.breaks if b.endswith("is torch.compiler.disable()d")]
        disabled = te_disabled_reason()
        return reasons + ([f"TE disabled its torch.compile support: {disabled}"] if disabled else [])

    @property
    def path(self) -> str:
        """"compiled": TE's op ran for every TE module, no TE fallback break; else "fallback"."""
        compiled, fallen = self.layers()
        te_break = any(b.startswith("te.Linear falling back") for b in self.breaks)
        return "compiled" if compiled and not fallen and not te_break else "fallback"

    def figures(self) -> dict[str, Any]:
        compiled, fallen = self.layers()
        path = self.path
        return {"te_compile_path": path,
                "te_compile_reason": "; ".join(self.te_reasons()) if path == "fallback" else "",
                "graph_breaks": sum(self.breaks.values()), "graphs": self.graphs,
                "graph_break_reasons": dict(sorted(self.breaks.items())),
                "te_compile_layers": {"compiled": compiled, "fallback": fallen},
                "te_compile_warnings": list(self.warnings)}


def te_modules_of(inner: torch.nn.Module, labels: dict[str, str], api) -> dict[str, tuple[str, bool]]:
    """qualified name -> (layer label, is a te.Linear) for the TE modules the converter made."""
    return {q: (label, isinstance(inner.get_submodule(q), api.Linear)) for q, label in labels.items()}


class TorchCompileTEBackend(TEEagerBackend):
    """TE modules of the active --te-impl under torch.compile (static shapes; graph breaks allowed: TE's fallback is
    one); the prepared callable carries its CompileLog as `te_compile`."""

    def __init__(self, dynamo_backend: str = "aot_eager") -> None:
        super().__init__()  # te_eager's state (no extra sites: the case's own TE sites are what compiles)
        # The torch.compile backend each inspected graph is handed to.
        self.dynamo_backend = dynamo_backend
        self.name = next(n for n, b in BACKENDS.items() if b == dynamo_backend)

    def available(self) -> tuple[bool, str]:
        if not self.impl.runs_te_python:
            return False, (f"TE's torch.compile path is TE's own Python (module/linear.py's custom op); --te-impl "
                           f"{self.impl.name} serves none")
        if self.dynamo_backend not in torch._dynamo.list_backends(exclude_tags=()):
            return False, f"torch {torch.__version__} has no dynamo backend {self.dynamo_backend!r}"
        return super().available()

    def unsupported_reason(self, spec: CaseSpec) -> str | None:
        te = spec.te or TEConfig()
        if te.module.startswith("ops_") or te.module in ("grouped_mlp", *NORM_MODULES, *MLP_MODULES):
            return (f"TE ships no compiled path for {te.module} (only te.Linear): Dynamo would trace its Python "
                    f"with a graph break at every tex call; nothing of TE's compile path to certify")
        if spec.autocast:
            # Measured on torch 2.15 (te_autocast, acbf16): 8-10 GEMMs per case left unattributed, every layer's
            # required GEMMs counted 0; the gradients are not what is unsupported, the waste probe is.
            return (f"te_verify's GEMM attribution cannot name the layer of a GEMM over torch.autocast's "
                    f"{spec.autocast} weight copies made inside the compiled graph (gemm_work would count every "
                    f"layer's GEMMs as unattributable); torch.autocast cases run on te_eager only")
        if spec.recompute != "none":  # TE's checkpoint is @torch._disable_dynamo: a graph break per block, unmeasured
            return "activation recompute under TE's torch.compile path is not built yet (issue 34: te_eager only)"
        return super().unsupported_reason(spec)

    def prepare(self, model: torch.nn.Module, spec: CaseSpec) -> Callable:
        tex_opaque_to_dynamo()
        api = self.impl.api
        te = spec.te or TEConfig()
        if te.main_grad:
            attach_main_grad(model, te)
        recipe = te_api.case_recipe(api, te)
        # Built without a recipe: TE's autocast goes around the compiled call (run below), not inside the graph.
        if spec.model is not None:
            inner = TEFamily(convert_family(model, spec, api), api, None)
            from te_verify.oracle.required import te_sites

            labels = {f"model.{label}": label for label in te_sites(spec)}
        else:
            kind = KINDS[te.module]
            inner = TEStack(convert(model, spec, api), kind, api, None)
            names = [n for n, _ in model.named_children()]
            labels = {f"layers.{i}": "+".join(names[i * kind.layers:(i + 1) * kind.layers])
                      for i in range(len(inner.layers))}
        log = CompileLog(te_modules_of(inner, labels, api))
        compiled = torch.compile(inner, backend=log.backend(torch._dynamo.lookup_backend(self.dynamo_backend)),
                                 dynamic=False)
        return _callable(compiled, inner, log, api, recipe)


def _callable(compiled, inner: torch.nn.Module, log: CompileLog, api, recipe) -> Callable:
    """The prepared callable: TE's autocast (with a recipe) around the compiled module, each call watched by `log`."""

    @contextlib.contextmanager
    def around(first: bool | None) -> Iterator[None]:
        with log.watching(first), api.autocast(enabled=True, recipe=recipe) if recipe else contextlib.nullcontext():
            yield

    if isinstance(inner, TEStack):
        def run(x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
            with around(is_first_microbatch):
                return compiled(x, is_first_microbatch) if is_first_microbatch is not None else compiled(x)
        run.backward_dw = inner.backward_dw
    else:
        def run(x: torch.Tensor) -> torch.Tensor:
            with around(None):
                return compiled(x)
    run.__wrapped__ = compiled  # count_compilations reads dynamo's graphs
    run.te_compile = log
    return run
