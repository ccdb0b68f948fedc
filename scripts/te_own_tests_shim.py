"""pytest plugin: TE's own tests/pytorch run on CPU over the tex emulation (scripts/te_own_tests.py loads it).

TE's test files are TE's code too: they touch CUDA as TE's modules do (`device="cuda"`, `torch.cuda.manual_seed`,
`x.cuda()`), so the shim compiles every module under the tests directory (test files, utils.py, references/) with
the emulation's own CUDA rewrite (te_verify/te/tecpu/rewrite.py), after one rule of its own: every "cuda" string
constant (tests also assign it, `device = "cuda"`) is "cpu", the emulated device. The emulated capability comes from
TE_OWN_TESTS_CAPABILITY (default sm100: MXFP8 and NVFP4 run), the emulated cuBLASLt version from TE_VERIFY_CUBLASLT
(read by tecpu.boot; te_own_tests.py --cublaslt sets it; 13.0 unset). TE's checkpoints (LayerNormMLP(checkpoint=True),
distributed.checkpoint) get the te_eager lane's CPU RNG step (compat.te_checkpoint_cpu). Assertion rewriting is off
(`--assert=plain`): the rewriting finder serves those modules instead of pytest's.
"""
from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import json
import os
import sys
import types

import torch

from te_verify.compat import te_checkpoint_cpu
from te_verify.te import tecpu
from te_verify.te.tecpu import cuda, rewrite

TESTS_DIR_ENV = "TE_OWN_TESTS_DIR"
CAPABILITY_ENV = "TE_OWN_TESTS_CAPABILITY"
# A JSON-lines file each finished test phase is appended to as it ends: what a process killed before its JUnit XML
# (a torch op in flight at the runner's time limit) still tells.
PROGRESS_ENV = "TE_OWN_TESTS_PROGRESS"
# Set: uninitialized float memory reads NaN (torch's deterministic mode, warn-only; TE reads that mode where it
# chooses attention backends).
NAN_UNINITIALIZED_ENV = "TE_OWN_TESTS_NAN_UNINITIALIZED"


class CudaStrings(ast.NodeTransformer):
    """Every "cuda" / "cuda:N" string constant -> "cpu"."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and rewrite.CUDA_STRING.match(node.value):
            return ast.copy_location(ast.Constant("cpu"), node)
        return node


class TestsLoader(importlib.machinery.SourceFileLoader):
    """A TE test module's source with the CUDA touch points rewritten."""

    shim = None  # made at configure, after the boot: a shim made at import would carry the default capability
    log = rewrite.RewriteLog()

    def get_code(self, fullname: str) -> types.CodeType:
        return rewrite.rewrite_source(self.get_data(self.path).decode("utf-8"), self.path, self.log.sites, CudaStrings())

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__[rewrite.SHIM_NAME] = self.shim
        super().exec_module(module)


class TestsFinder:
    """Serves the modules whose file lies under TE's tests directory through TestsLoader."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root) + os.sep

    def find_spec(self, fullname, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not os.path.realpath(spec.origin).startswith(self.root):
            return None
        if not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=TestsLoader(fullname, spec.origin),
                                                      submodule_search_locations=spec.submodule_search_locations)


def install() -> None:
    """Boot the emulation and serve TE's test modules through the rewrite (TE_OWN_TESTS_DIR names their directory)."""
    root = os.environ.get(TESTS_DIR_ENV)
    if not root:
        raise RuntimeError(f"{TESTS_DIR_ENV} is not set: the directory of TE's tests/pytorch")
    tecpu.boot(os.environ.get(CAPABILITY_ENV, "sm100"))
    TestsLoader.shim = cuda.make_shim()  # the test modules' torch.cuda answers the booted capability, as TE's does
    if os.environ.get(NAN_UNINITIALIZED_ENV):
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
    te_checkpoint_cpu.apply()  # TE's checkpoints read torch.cuda.default_generators, which the emulation refuses
    sys.meta_path.insert(0, TestsFinder(root))


def pytest_configure(config) -> None:
    install()


def run_main(module: str, argv: list[str]) -> None:
    """A test module's own main() with argv, over the emulation: the steps TE's CI runs a test file as a script for
    (qa/L0_pytorch_unittest/test.sh: `test_checkpoint.py --save-checkpoint all` writes the checkpoints its tests load)."""
    install()
    sys.argv = [module + ".py", *argv]
    importlib.import_module(module).main()


def pytest_runtest_logreport(report) -> None:
    """Append the phase's outcome (nodeid, phase, outcome, its error's message as JUnit keeps it) to the progress
    file, one flushed line; passed set-ups and teardowns are left out."""
    path = os.environ.get(PROGRESS_ENV)
    if not path or (report.passed and report.when != "call"):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        message = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        message = report.longrepr[2]
    else:
        message = str(report.longrepr or "")
    with open(path, "a") as progress:
        progress.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                   "message": message}) + "\n")


if __name__ == "__main__":
    run_main(sys.argv[1], sys.argv[2:])
