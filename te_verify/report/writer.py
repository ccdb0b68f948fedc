"""A run's report folder: results.json, summary.md, report.html and one repro script per failed case."""
from __future__ import annotations

from pathlib import Path

from te_verify.report.html import render_html
from te_verify.report.repro import write_repros
from te_verify.report.results import write_results
from te_verify.report.summary import render_summary


def write_report(report_dir: Path, results: dict, backend_paths: dict[str, str] | None = None) -> Path:
    """Write every artefact of a run from its results; `backend_paths` maps row backends to --backend values."""
    path = write_results(report_dir / "results.json", results["header"], results["rows"])
    (report_dir / "summary.md").write_text(render_summary(results))
    render_html(results, report_dir / "report.html")
    write_repros(results, report_dir, backend_paths=backend_paths)
    return path
