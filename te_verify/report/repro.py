"""Repro scripts: `<report-dir>/repro/<case-id>__<backend>.py` for every failed case of a run.

Each script is standalone (`python repro/<file>.py`): it rebuilds the spec, resolves the backend, runs the
case file's test function on it (the very check that failed) and exits 1 with the failure message, or 0
once the fault is gone. Its docstring carries the one-line pytest command for the same case.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pprint
import re
from pathlib import Path
from typing import Any, Callable

import jinja2

from te_verify.report.results import write_atomic

TEMPLATES = Path(__file__).parent / "templates"
REPRODUCED = ("failed", "error")  # xpassed rows "fail" by passing; a script cannot show that
MAX_NAME = 180  # keep file names well below the 255-byte limit of common filesystems


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "case"


def repro_filename(row: dict) -> str:
    """`<case-id>__<backend>.py` with every character outside [A-Za-z0-9_.-] replaced by `_`."""
    stem = f"{_safe(row.get('case_id') or row['nodeid'])}__{_safe(row.get('backend') or '-')}"
    if len(stem) > MAX_NAME:
        stem = stem[:MAX_NAME - 9] + "-" + hashlib.sha1(stem.encode()).hexdigest()[:8]
    return stem + ".py"


def _shell_quote(text: str) -> str:
    """Double-quoted for POSIX shells (node ids hold brackets)."""
    return '"' + re.sub(r'(["\\$`])', r"\\\1", text) + '"'


def chosen_te_impl(te_impl: dict | None) -> str | None:
    """The `--te-impl` a run was given (its header's te_impl entry), None where it ran the machine's default: a
    repro of a user's build must load that build again."""
    return te_impl["name"] if te_impl and str(te_impl.get("why", "")).startswith("--te-impl") else None


def pytest_command(row: dict, tier: str | None = None, backend_path: str | None = None,
                   te_impl: str | None = None) -> str:
    """`pytest "<nodeid>" --tier <tier> --backend <backend> [--te-impl <build>]`: the one case, on the one backend,
    over the TE build the run was given."""
    parts = ["pytest", _shell_quote(row["nodeid"])]
    if tier:
        parts += ["--tier", tier]
    backend = backend_path or row.get("backend")
    if backend and backend != "-" and not (row.get("spec") or {}).get("dist"):
        parts += ["--backend", backend]
    if te_impl:
        parts += ["--te-impl", te_impl]
    return " ".join(parts)


def repro_hint(row: dict, tier: str | None, report_dir: Path, backend_path: str | None = None,
               te_impl: str | None = None) -> str:
    """Two lines for a failure message: the pytest command and the repro script."""
    return (f"reproduce: {pytest_command(row, tier, backend_path, te_impl)}\n"
            f"       or: python {Path(report_dir) / 'repro' / repro_filename(row)}")


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def render_script(row: dict, run_id: str, tier: str | None, backend_path: str | None = None,
                  te_impl: str | None = None) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["pyrepr"] = repr
    return env.get_template("repro.py.j2").render(
        row=row, filename=f"repro/{repro_filename(row)}", run_id=run_id,
        command=_docstring_safe(pytest_command(row, tier, backend_path, te_impl)), te_impl=te_impl,
        reason=_docstring_safe(row.get("reason") or "(no message recorded)"),
        backend_path=backend_path or row["backend"], spec=pprint.pformat(row["spec"], width=100))


def write_repros(results: dict, report_dir: Path, backend_paths: dict[str, str] | None = None) -> list[Path]:
    """One script per failed/errored case row with a spec; `backend_paths` maps a backend's report name to
    what resolve_backend() needs (e.g. "planted" -> "tests.planted_backends:OffByOnePercent")."""
    header = results.get("header", {})
    paths = backend_paths or {}
    written: list[Path] = []
    for row in results["rows"]:
        if row["outcome"] not in REPRODUCED or not row.get("spec"):
            continue
        path = Path(report_dir) / "repro" / repro_filename(row)
        if path in written:  # the same case and backend failed in two test functions: keep both
            path = path.with_name(f"{path.stem}__{_safe(row['nodeid'].split('::')[-1].split('[')[0])}.py")
        write_atomic(path, render_script(row, header.get("run_id", "?"), header.get("tier"), paths.get(row["backend"]),
                                         chosen_te_impl(header.get("te_impl"))))
        written.append(path)
    return written


def _case_file(relative: str) -> Path | None:
    """The case file of a node id, relative to the working directory or to the te_verify checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / relative).is_file():
            return root / relative
    return None


def case_check(nodeid: str) -> Callable[[Any], Any]:
    """The test function a node id names, when it takes only `case`; otherwise CaseRun.verify.

    Used by repro scripts so they run the check that failed, not only the standard verify()."""
    from te_verify.run.caserun import CaseRun

    relative, _, rest = nodeid.partition("::")
    path = _case_file(relative)
    if path is None or not rest:
        return CaseRun.verify
    spec = importlib.util.spec_from_file_location(f"te_verify_repro_{_safe(path.stem)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, rest.split("[")[0], None)
    if function is None or list(inspect.signature(function).parameters) != ["case"]:
        return CaseRun.verify
    return function
