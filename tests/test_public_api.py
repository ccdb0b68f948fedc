"""te_verify.api is what user code imports (docs/api.md): the examples and every README/docs snippet import only from
it; it is exactly its `__all__` and light to import; the paths the reorganisation moved (te_verify.moved) still import
for one release, each with a DeprecationWarning naming the new import and giving the same object; `--te-impl
te_verify.reference` still runs; and a user's engine written only against te_verify.api passes its cases while the
same engine with a planted fault fails them. (The user's wrapper: tests/test_user_wrapper.py; the user's backend:
tests/test_plugin.py's external_backend run.)"""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from docs_pages import PAGES, read_page
from test_user_wrapper import run_cases

import te_verify.api as api
from te_verify import moved
from te_verify.te import api as te_api

ROOT = Path(__file__).resolve().parents[1]
# User code this checkout ships: the worked examples and the user-written modules the tests load by path.
USER_CODE = (*sorted((ROOT / "examples").glob("*.py")), ROOT / "tests" / "external_backend.py",
             ROOT / "tests" / "minimal_te_build.py", ROOT / "tests" / "planted_user_engine.py")
# What importing the public module must not import: TE (booted or not), thunder, the wrappers and engines.
HEAVY = ("transformer_engine", "thunder", "te_verify.te.tecpu", "te_verify.distributed.wrappers",
         "te_verify.distributed.engines", "deepspeed", "megatron", "fairscale")
ENGINE = "examples.user_engine:FlatAllReduceSGD"
PLANTED_ENGINE = "planted_user_engine:DecayingFlatAllReduceSGD"
# The README's import line of the last release, before the reorganisation (2d5dd5f~1:examples/user_wrapper.py).
OLD_README_IMPORT = ("from te_verify.distributed.wrappers import Wrapped, grad_of, param_slots, param_tensors, "
                     "units_of, value_of")


def past_the_surface(where: str, source: str, first_line: int = 1) -> list[str]:
    """Each import in `source` of a te_verify module other than te_verify.api, as `where:line: ...`."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            # `from te_verify import api` names the module it imports; `from te_verify.x import y` names te_verify.x.
            targets = [f"te_verify.{a.name}" if node.module == "te_verify" else node.module for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        problems += [f"{where}:{first_line + node.lineno - 1}: imports {t}; user code imports te_verify.api only"
                     for t in targets if t.split(".")[0] == "te_verify" and t != moved.PUBLIC]
    return problems


def snippets() -> list[tuple[str, str, int]]:
    """Every python block of README.md and docs/*.md: (page, body, the page's line of its first line)."""
    return [(page.path.name, body, start) for page in map(read_page, PAGES)
            for (info, body), start in zip(page.blocks, page.starts) if info == "python"]


def test_examples_and_user_modules_import_only_the_public_module():
    assert len(USER_CODE) >= 6
    problems = [p for path in USER_CODE for p in past_the_surface(str(path.relative_to(ROOT)), path.read_text())]
    assert not problems, "\n".join(problems)


def test_every_readme_and_docs_snippet_imports_only_the_public_module():
    found = snippets()
    assert any("from te_verify.api import" in body for _, body, _ in found)  # a snippet shows the import
    problems = [p for page, body, start in found for p in past_the_surface(page, body, start)]
    assert not problems, "\n".join(problems)


def test_a_snippet_reaching_past_the_surface_is_named_by_file_and_line():
    planted = "import torch\n\nfrom te_verify.distributed.types import Wrapped\nfrom te_verify import spec\n"
    assert past_the_surface("README.md", planted, first_line=190) == [
        "README.md:192: imports te_verify.distributed.types; user code imports te_verify.api only",
        "README.md:193: imports te_verify.spec; user code imports te_verify.api only"]
    # The same names through the public module, spelled three ways, pass.
    clean = ("import te_verify.api\nimport te_verify.api as tv\nfrom te_verify import api\n"
             "from te_verify.api import Wrapped\n")
    assert past_the_surface("README.md", clean) == []


def test_the_readme_snippet_lines_are_found_where_they_are():
    readme = (ROOT / "README.md").read_text().splitlines()
    found = [(start, body) for page, body, start in snippets() if page == "README.md"]
    assert found and all(readme[start - 1] == body.splitlines()[0] for start, body in found)


def test_the_public_module_is_exactly_its_all():
    # (pytest's assertion rewriting adds "@py_builtins" to te_verify's modules: not identifiers, not names.)
    public = {name for name in vars(api) if name.isidentifier() and not name.startswith("_") and name != "annotations"}
    assert public == set(api.__all__) and len(api.__all__) == len(set(api.__all__))


def test_the_public_module_imports_nothing_heavy():
    probe = f"import sys, te_verify.api; print([m for m in sys.modules if m.startswith({HEAVY!r})])"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("old, name", [(old, name) for old, names in moved.NAMES.items() for name in names])
def test_a_moved_name_imports_with_one_warning_naming_the_new_import(old, name):
    home, use = moved.NAMES[old][name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope: dict = {}
        exec(f"from {old} import {name}", scope)
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert messages == [f"{old}.{name} is deprecated since the reorganisation into packages and goes in te_verify "
                        f"{moved.REMOVED_IN}: use `from {use} import {name}` (docs/api.md)"]
    assert scope[name] is getattr(importlib.import_module(home), name)
    if use == moved.PUBLIC:
        assert scope[name] is getattr(api, name)


def test_the_last_releases_readme_import_works_with_a_warning_per_name():
    with pytest.warns(DeprecationWarning) as caught:
        exec(OLD_README_IMPORT, {})
    assert [str(w.message).split(" is deprecated")[0] for w in caught] == [
        f"te_verify.distributed.wrappers.{n}" for n in ("Wrapped", "grad_of", "param_slots", "param_tensors",
                                                        "units_of", "value_of")]


def test_an_unmoved_name_is_still_an_attribute_error():
    with pytest.raises(ImportError, match="cannot import name 'Nothing' from 'te_verify.distributed.training'"):
        exec("from te_verify.distributed.training import Nothing", {})
    from te_verify.distributed.wrappers import ddp, wrap  # its own names and submodules: no warning

    assert callable(wrap) and ddp.__name__ == "te_verify.distributed.wrappers.ddp"


@pytest.mark.parametrize("old", sorted(moved.MODULES))
def test_a_moved_module_is_an_alias_that_warns(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh, as by a new process
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated .*: import {moved.MODULES[old]} instead"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(moved.MODULES[old])
    assert (ROOT / (old.replace(".", "/") + ".py")).read_text().rstrip().endswith("moved.alias(__name__)")


def test_every_module_with_moved_names_serves_them_from_the_table():
    for old in moved.NAMES:
        assert importlib.import_module(old).__getattr__.__qualname__.startswith("module_getattr"), old


def test_te_impl_te_verify_reference_still_resolves(monkeypatch):
    monkeypatch.delitem(sys.modules, "te_verify.reference", raising=False)
    with pytest.warns(DeprecationWarning, match="^te_verify.reference is deprecated"):
        impl = te_api.resolve("te_verify.reference")
    assert impl.kind == te_api.EXTERNAL and impl.api.Linear is importlib.import_module("te_verify.te.reference").Linear
    assert impl.describe == ("te_verify.reference (a user-supplied TE API module; a deprecated path, use --te-impl "
                             "te_verify.te.reference)")


@pytest.mark.system
def test_te_impl_te_verify_reference_still_runs_a_te_family(tmp_path):
    command = [sys.executable, "-m", "pytest", "cases/test_te_peft.py", "-q", "-p", "no:cacheprovider", "--tier",
               "smoke", "--backend", "te_eager", "--te-impl", "te_verify.reference", "--report-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["header"]["te_impl"]["name"] == "te_verify.reference"
    assert results["rows"] and {r["outcome"] for r in results["rows"]} == {"passed"}


@pytest.mark.system
def test_a_users_engine_on_the_public_module_passes_and_its_planted_twin_fails(tmp_path):
    """examples/user_engine.py trains under its name and is judged like an engine (params_after_steps,
    engine_state); the same engine decaying its frozen weights fails params_after_steps alone, naming them."""
    done, rows = run_cases(tmp_path, (ENGINE, PLANTED_ENGINE), "cases/test_dist_ddp.py")
    clean = [r for r in rows if r["backend"] == "flat_allreduce_sgd"]
    planted = [r for r in rows if r["backend"] == "decaying_flat_allreduce_sgd"]
    assert done.returncode == 1 and len(rows) == len(clean) + len(planted), done.stdout[-3000:]
    assert clean and {r["outcome"] for r in clean} == {"passed"}
    assert all({"params_after_steps", "engine_state"} <= set(r["checks"]) for r in clean)
    assert planted and {r["outcome"] for r in planted} == {"failed"}
    failing = [({c for c, v in r["checks"].items() if v != "passed"}, r["reason"]) for r in planted]
    assert all(checks == {"params_after_steps"} and "after step 1, frozen 1.weight: changed" in reason
               for checks, reason in failing), failing
