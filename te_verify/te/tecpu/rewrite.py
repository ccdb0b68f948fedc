"""TE's CUDA touch points, rewritten lexically in TE's own modules as they are imported.

The emulated accelerator is the CPU. Rather than patching torch for everyone (or guessing the caller from
stack frames, which breaks in autograd's backward thread), the loader compiles each `transformer_engine.*`
module from its own source after these rewrites, which therefore hold exactly in TE's code and nowhere else:

  R1 `torch.cuda`                      -> the strict fake namespace (te_verify.te.tecpu.cuda): what it does not
                                          emulate raises, naming the attribute and TE's call site
  R2 `x.is_cuda`                       -> `x` lives on the emulated device (the CPU)
  R3 `x.cuda(...)`                     -> `x`, checked to be on the emulated device
  R4 `"cuda"` / `"cuda:N"` as a call argument or compared with ==/!= -> `"cpu"`
  R5 `torch.device("cuda", i)`         -> `torch.device("cpu")` (a CPU device has no index)
  R6 `device=torch.cuda.current_device()` -> `device="cpu"`, also inside the keyword's expression
     (`device=torch.cuda.current_device() if device is None else device`, quantized_tensor.py); elsewhere
     current_device() is 0
  R7 a parameter default `"cuda"` (`def __init__(..., device="cuda")`) -> `"cpu"`
  R8 `torch.cuda.current_device()` passed positionally to a function of the same module whose parameter at that
     position is `device` (TE 2.20's nvfp4_tensor.py: get_rht_matrix(flag, torch.cuda.current_device())) -> `"cpu"`
  R9 `torch.version.cuda`               -> the emulated CUDA version (te_verify.te.tecpu.device.CUDA_VERSION): CPU
                                          torch has None, on which TE's FP8 block-scaling check fails
  R10 `torch.is_autocast_enabled()`     -> `torch.is_autocast_enabled("cpu")`: without an argument torch (>= 2.4)
                                          reads CUDA's autocast, which on the emulated device is the CPU's (TE's
                                          modules take their activation dtype from it, module/base.py)
  R11 `x.is_cpu`                       -> false for `x` on the emulated device: it is TE's accelerator, so TE's
                                          CPU fallbacks (float8_tensor_storage.py's dequantize) must not run where a
                                          GPU would call tex
  R12 `from torch.cuda import a, b as c` -> `a = <R1's namespace>.a; c = <R1's namespace>.b`: names imported from
                                          torch.cuda are R1's too (distributed.py binds `_lazy_init`, which on a
                                          CPU torch raises "Torch not compiled with CUDA enabled" past the fake)

Line numbers are kept, so tracebacks and call sites name TE's real file:line. Every rewrite is recorded.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from te_verify.te.tecpu import rewrite_cache, triton_kernels
from te_verify.te.tecpu.strict import UnemulatedFunction

CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
SHIM_NAME = "__tecpu__"  # the global every rewritten module gets: the helpers the rewritten code calls
STUB_PACKAGES = ("transformer_engine.pytorch.triton", "transformer_engine.common.triton")
# The rules' version for rewrite_cache's key: this file's own source (a rule changed here is a cache miss).
RULES = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


@dataclass
class RewriteLog:
    """Every rewrite applied, by rule and by TE file, for the report header."""

    # (file relative to the site-packages dir, line, rule) per rewrite.
    sites: list[tuple[str, int, str]] = field(default_factory=list)
    # Names of the stub modules served for TE's triton kernels.
    stubbed_modules: list[str] = field(default_factory=list)

    def by_rule(self) -> dict[str, int]:
        return dict(sorted(Counter(rule for _, _, rule in self.sites).items()))


def _is_cuda_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(CUDA_STRING.match(node.value))


def _is_torch_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
        and node.value.id == "torch"


def _is_current_device_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "current_device" and _is_torch_attr(node.func.value, "cuda")


def _shim(attr: str) -> ast.Attribute:
    return ast.Attribute(ast.Name(SHIM_NAME, ast.Load()), attr, ast.Load())


def _device_positions(tree: ast.Module) -> dict[str, int]:
    """Module-level functions taking a positional parameter named `device`: name -> its position (R8)."""
    positions = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
            if "device" in names:
                positions[node.name] = names.index("device")
    return positions


def _is_torch_version_cuda(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "cuda" and _is_torch_attr(node.value, "version")


class CudaRewriter(ast.NodeTransformer):
    """Applies R1-R12 to one module's tree, appending to `sites`."""

    def __init__(self, filename: str, sites: list[tuple[str, int, str]],
                 device_positions: dict[str, int] | None = None) -> None:
        self.filename, self.sites = filename, sites
        self.device_positions = device_positions or {}

    def _note(self, node: ast.AST, rule: str) -> None:
        self.sites.append((self.filename, getattr(node, "lineno", 0), rule))

    def _cpu(self, node: ast.AST, rule: str) -> ast.Constant:
        self._note(node, rule)
        return ast.copy_location(ast.Constant("cpu"), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _is_torch_attr(node.func, "device") and node.args and _is_cuda_string(node.args[0]):
            self._note(node, "R5 torch.device('cuda', i)")
            return ast.copy_location(ast.Call(node.func, [ast.Constant("cpu")], []), node)
        if _is_torch_attr(node.func, "is_autocast_enabled") and not node.args and not node.keywords:
            self._note(node, "R10 torch.is_autocast_enabled()")
            return ast.copy_location(ast.Call(node.func, [ast.Constant("cpu")], []), node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not _is_torch_attr(node.func, "cuda"):
            self._note(node, "R3 x.cuda()")
            target = self.visit(node.func.value)
            return ast.copy_location(ast.Call(_shim("to_emulated_device"), [target], []), node)
        node.args = [self._cpu(a, "R4 'cuda' argument") if _is_cuda_string(a) else a for a in node.args]
        position = self.device_positions.get(node.func.id) if isinstance(node.func, ast.Name) else None
        if position is not None and position < len(node.args) and _is_current_device_call(node.args[position]):
            node.args[position] = self._cpu(node.args[position], "R8 positional device=torch.cuda.current_device()")
        for kw in node.keywords:
            if _is_cuda_string(kw.value):
                kw.value = self._cpu(kw.value, "R4 'cuda' argument")
            elif kw.arg == "device":
                kw.value = _DeviceKeyword(self).visit(kw.value)
        return self.generic_visit(node)

    def visit_arguments(self, node: ast.arguments) -> ast.AST:
        node.defaults = [self._cpu(d, "R7 'cuda' default") if _is_cuda_string(d) else d for d in node.defaults]
        node.kw_defaults = [self._cpu(d, "R7 'cuda' default") if d is not None and _is_cuda_string(d) else d
                            for d in node.kw_defaults]
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        if all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            node.left = self._cpu(node.left, "R4 == 'cuda'") if _is_cuda_string(node.left) else node.left
            node.comparators = [self._cpu(c, "R4 == 'cuda'") if _is_cuda_string(c) else c for c in node.comparators]
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and _is_torch_version_cuda(node):
            self._note(node, "R9 torch.version.cuda")
            return ast.copy_location(_shim("cuda_version"), node)
        if isinstance(node.ctx, ast.Load) and _is_torch_attr(node, "cuda"):
            self._note(node, "R1 torch.cuda")
            return ast.copy_location(_shim("cuda"), node)
        if isinstance(node.ctx, ast.Load) and node.attr == "is_cuda":
            self._note(node, "R2 x.is_cuda")
            target = self.visit(node.value)
            return ast.copy_location(ast.Call(_shim("on_emulated_device"), [target], []), node)
        if isinstance(node.ctx, ast.Load) and node.attr == "is_cpu":
            self._note(node, "R11 x.is_cpu")
            target = self.visit(node.value)
            return ast.copy_location(ast.Call(_shim("off_emulated_device"), [target], []), node)
        return self.generic_visit(node)


    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | list[ast.AST]:
        if node.module != "torch.cuda" or node.level:
            return node
        if any(alias.name == "*" for alias in node.names):
            raise SyntaxError(f"{self.filename}:{node.lineno}: `from torch.cuda import *` has no R12 rewrite")
        self._note(node, "R12 from torch.cuda import")
        return [ast.copy_location(ast.Assign([ast.Name(alias.asname or alias.name, ast.Store())],
                                             ast.Attribute(_shim("cuda"), alias.name, ast.Load())), node)
                for alias in node.names]


class _DeviceKeyword(ast.NodeTransformer):
    """R6 within one `device=` keyword's value: each torch.cuda.current_device() call in it becomes "cpu"."""

    def __init__(self, outer: CudaRewriter) -> None:
        self.outer = outer

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _is_current_device_call(node):
            return self.outer._cpu(node, "R6 device=torch.cuda.current_device()")
        return self.generic_visit(node)


def rewrite_source(source: str, filename: str, sites: list[tuple[str, int, str]],
                   first: ast.NodeTransformer | None = None) -> types.CodeType:
    """Compile TE source with the CUDA touch points rewritten (line numbers preserved); `first`, if given, rewrites
    the tree before the rules do (scripts/te_own_tests_shim.py, for TE's test files)."""
    tree = ast.parse(source, filename)
    tree = first.visit(tree) if first is not None else tree
    tree = CudaRewriter(filename, sites, _device_positions(tree)).visit(tree)
    return compile(ast.fix_missing_locations(tree), filename, "exec", dont_inherit=True)


class RewritingLoader(importlib.machinery.SourceFileLoader):
    """TE's own source, rewritten; never cached to TE's __pycache__ (the real loader must not see it)."""

    def __init__(self, fullname: str, path: str, finder: "TEFinder") -> None:
        super().__init__(fullname, path)
        self.finder = finder

    def get_code(self, fullname: str) -> types.CodeType:
        source, filename = self.get_data(self.path), _relative(self.path)
        return rewrite_cache.load_or_rewrite(
            source, filename, RULES, self.finder.log.sites,
            lambda sites: rewrite_source(source.decode("utf-8"), filename, sites))

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__[SHIM_NAME] = self.finder.shim
        super().exec_module(module)
        after = self.finder.after_exec.get(module.__name__)
        if after is not None:
            after(module)


class StubLoader(importlib.abc.Loader):
    """TE's triton kernel modules: importable; the wrappers in triton_kernels.EMULATED run in PyTorch, every other
    attribute is an UnemulatedFunction."""

    def __init__(self, log: RewriteLog) -> None:
        self.log = log

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so its submodules are stubbed too

        def __getattr__(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return UnemulatedFunction(f"{spec.name}.{name} (a triton kernel)")

        module.__getattr__ = __getattr__
        module.__dict__.update(triton_kernels.EMULATED.get(spec.name, {}))
        self.log.stubbed_modules.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class ObservedLoader(importlib.machinery.SourceFileLoader):
    """Another package's module, loaded as it is; `after(module)` runs once it executed (a compatibility step for a
    library that loads TE's source itself: nvinspect.py)."""

    def __init__(self, fullname: str, path: str, after: Callable[[types.ModuleType], None]) -> None:
        super().__init__(fullname, path)
        self.after = after

    def exec_module(self, module: types.ModuleType) -> None:
        super().exec_module(module)
        self.after(module)


class TEFinder(importlib.abc.MetaPathFinder):
    """Serves every `transformer_engine.*` module through the rewriting loader (stubs for triton kernels unless
    `stub_triton` is false: real_triton.py), and the other modules named in `after_exec` through an ObservedLoader."""

    def __init__(self, shim: types.SimpleNamespace, log: RewriteLog,
                 after_exec: dict[str, Callable[[types.ModuleType], None]], stub_triton: bool = True) -> None:
        self.shim, self.log, self.after_exec, self.stub_triton = shim, log, after_exec, stub_triton

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] != "transformer_engine":
            return self._observed_spec(fullname, path)
        if self.stub_triton and any(fullname == p or fullname.startswith(p + ".") for p in STUB_PACKAGES):
            return importlib.util.spec_from_loader(fullname, StubLoader(self.log), is_package=True)
        return _source_spec(fullname, path, lambda origin: RewritingLoader(fullname, origin, self))

    def _observed_spec(self, fullname: str, path):
        if fullname not in self.after_exec:
            return None
        return _source_spec(fullname, path, lambda origin: ObservedLoader(fullname, origin, self.after_exec[fullname]))

    def spec_for_file(self, name: str, path: str) -> importlib.machinery.ModuleSpec:
        """A spec loading TE's source file `path` as module `name`, rewritten (a file another library loads by
        path, outside the import system)."""
        return importlib.util.spec_from_file_location(name, path, loader=RewritingLoader(name, path, self))


def _source_spec(fullname: str, path, make_loader: Callable[[str], importlib.abc.Loader]):
    """The path finder's spec for `fullname`, its source file loaded by `make_loader(origin)` instead (anything but
    a source module, as the path finder found it)."""
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
        return spec
    return importlib.util.spec_from_file_location(fullname, spec.origin, loader=make_loader(spec.origin),
                                                  submodule_search_locations=spec.submodule_search_locations)


def _relative(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[parts.index("transformer_engine"):]) if "transformer_engine" in parts else path


def install(shim: types.SimpleNamespace, log: RewriteLog,
            after_exec: dict[str, Callable[[types.ModuleType], None]], stub_triton: bool = True) -> TEFinder:
    """Put the finder first on sys.meta_path; `after_exec[name](module)` runs once that module executed."""
    if _installed() is not None:
        raise RuntimeError("te_verify.te.tecpu: TE's import hook is already installed in this process")
    finder = TEFinder(shim, log, after_exec, stub_triton)
    sys.meta_path.insert(0, finder)
    return finder


def installed_finder() -> TEFinder:
    """The finder install() put on sys.meta_path."""
    finder = _installed()
    if finder is None:
        raise RuntimeError("te_verify.te.tecpu: TE's import hook is not installed in this process")
    return finder


def _installed() -> TEFinder | None:
    return next((finder for finder in sys.meta_path if isinstance(finder, TEFinder)), None)
