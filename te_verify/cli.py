"""te-verify: run the cases and write the report; diff two nights; re-render a report; update expectations.

    te-verify run [--tier pr] [--backend NAME|pkg.mod:attr ...] [--report-dir DIR] [--device D] [--shard K/N]
                  [--workers N] [--resume DIR] [--case-timeout SECONDS] [pytest args]
    te-verify report DIR                (re-render a report folder, a killed run's partial one included)
    te-verify report diff OLD/results.json NEW/results.json
    te-verify report merge SHARD1 SHARD2 ... --out DIR
    te-verify report html RESULTS.json [--out report.html]
    te-verify expectations update REPORT_DIR_OR_RESULTS [--dir expectations]
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from te_verify.passes import run_passes

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "cases"


def default_report_dir() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return ROOT / "reports" / stamp


def default_workers() -> int:
    """One xdist worker per GPU where CUDA is available (each worker takes its own GPU), else one per core."""
    import torch

    return torch.cuda.device_count() or os.cpu_count() or 1


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Run cases/ under pytest with xdist; 0 only when nothing unexpectedly failed."""
    if args.resume:
        from te_verify.report.resume import ResumeError, stream_of

        try:
            stream_of(args.resume)
        except ResumeError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 4  # pytest's usage-error status, as the plugin's own refusal
    passes = capability_passes(args, extra)
    if passes:
        return run_passes(passes, pass_args(args, extra), Path(args.report_dir or default_report_dir()))
    import pytest

    report_dir = Path(args.resume or args.report_dir or default_report_dir())
    workers = default_workers() if args.workers is None else args.workers  # 0: in this process
    argv = [*([] if names_cases(extra) else [str(CASES)]), "-q", "-p", "no:cacheprovider", "--tier", args.tier,
            "--report-dir", str(report_dir),
            "--junitxml", str(report_dir / "junit.xml"), "-n", str(workers)]
    for backend in args.backend:
        argv += ["--backend", backend]
    for option in ("te_impl", "device", "shard", "resume", "case_timeout"):
        if getattr(args, option) is not None:
            argv += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    before = _written(report_dir / "results.json")
    code = pytest.main(argv + extra)
    if _written(report_dir / "results.json") not in (None, before):  # not after a usage error: its line says it all
        print(f"te-verify: report in {report_dir}")
    return int(code)


def names_cases(extra: list[str]) -> bool:
    """Whether the arguments for pytest select cases themselves: a node id or case file, or a file of them (pytest's
    @file). Then the cases folder is not added: pytest would run the union, the whole tier."""
    return any(a.startswith("@") or "::" in a or a.endswith(".py") for a in extra)


def capability_passes(args: argparse.Namespace, extra: list[str]) -> list:
    """With --passes, the main job's passes (te_verify.passes) on an emulated device; [] for one pass: without it, on a
    GPU (its capability decides), with a named --te-capability, a resumed run, or a TE build other than TE's Python
    over the emulation."""
    import torch

    from te_verify.backends.registry import TIER_DEFAULTS
    from te_verify.passes import compile_python, plan
    from te_verify.te.compile_path import torch_missing_api

    named = any(a.split("=")[0] in ("--te-capability", "--pass-name") for a in extra)
    if not args.passes or named or args.resume or torch.cuda.is_available() or (args.device or "cpu").startswith("cuda") \
            or args.te_impl not in (None, "transformer_engine_cpu"):
        return []
    backends = args.backend or list(TIER_DEFAULTS[args.tier])
    lacks_api = bool(torch_missing_api())
    passes = plan(backends, lacks_api, compile_python())
    if lacks_api and not any(p.name.startswith("compile") for p in passes) and \
            any(b.startswith("torch_compile_te") for b in backends):
        print("te-verify: torch_compile_te runs here with TE's modules falling back to eager (this torch lacks TE's "
              "compile API); `bash scripts/bootstrap.sh --compile` builds the environment where its compiled path runs",
              file=sys.stderr)
    return passes


def pass_args(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The run's own arguments, for each pass (its backends, report folder and capability are the pass's)."""
    out = ["--tier", args.tier]
    for option in ("te_impl", "device", "shard", "case_timeout", "workers"):
        if getattr(args, option) is not None:
            out += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    return out + list(extra)


def _written(path: Path) -> int | None:
    """When `path` was last written (ns), None if it does not exist."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def render_folder(report_dir: Path) -> int:
    """`te-verify report DIR`: every artefact of the run in DIR from its rows.jsonl, marked incomplete (with the
    cases that never ran) when the run was killed before it finished."""
    from te_verify.report.stream import StreamError, incomplete_line, partial_results
    from te_verify.report.writer import write_report

    try:
        results = partial_results(report_dir)
    except StreamError as exc:
        print(f"te-verify report: {exc}", file=sys.stderr)
        return 2
    write_report(report_dir, results, results["header"].get("backend_paths"))
    print(f"te-verify: report in {report_dir}" + (f" ({incomplete_line(results['header'])})"
                                                  if results["header"].get("incomplete") else ""))
    return 0


def expectations_update(args: argparse.Namespace) -> int:
    """Rewrite expectations/*.toml from a run, like `wpt update-expectations`; reasons and links are kept."""
    from te_verify.expectations.entries import ExpectationsError
    from te_verify.expectations.update import update_from_results

    source = Path(args.report)
    results = source / "results.json" if source.is_dir() else source
    try:
        summary = update_from_results(results, Path(args.dir))
    except (ExpectationsError, OSError, ValueError) as exc:
        print(f"te-verify expectations update: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary.lines()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="te-verify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a tier of cases and write the report; extra args go to pytest")
    run_p.add_argument("--tier", default="pr", choices=("smoke", "pr", "nightly"))
    run_p.add_argument("--backend", action="append", default=[], help="built-in name or package.module:attr")
    run_p.add_argument("--report-dir", default=None, help="default: reports/<timestamp>")
    run_p.add_argument("--te-impl", default=None, help="reference, transformer_engine or package.module")
    run_p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    run_p.add_argument("--shard", default=None, metavar="K/N", help="run shard K of N (merge with report merge)")
    run_p.add_argument("--resume", default=None, metavar="DIR",
                       help="finish the killed run in DIR (same selection): only its cases without a row run")
    run_p.add_argument("--case-timeout", type=float, default=None, metavar="SECONDS",
                       help="seconds a case may run before it fails 'timed out' (default per tier and lane; 0: none)")
    run_p.add_argument("--passes", action="store_true",
                       help="the main job (scripts/run.sh): on a CPU machine, every TE case at the emulated capability "
                            "it needs and torch_compile_te in .venv-compile, merged into one report")
    run_p.add_argument("--workers", default=None,
                       help="pytest-xdist workers (-n; 0: in this process; default: one per GPU with CUDA, else one "
                            "per core)")
    report_p = sub.add_parser("report", help="report tools: diff two results.json files, merge shard reports, "
                                             "or re-render HTML")
    report_p.add_argument("action", choices=("diff", "merge", "html"))
    exp_p = sub.add_parser("expectations", help="expectations tools")
    exp_p.add_argument("action", choices=("update",))
    exp_p.add_argument("report", help="a report folder or its results.json")
    exp_p.add_argument("--dir", default=str(ROOT / "expectations"), help="the expectations folder to rewrite")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["report", "diff"]:
        from te_verify.report import diff

        return diff.main(argv[2:])
    if argv[:2] == ["report", "merge"]:
        from te_verify.report import merge

        return merge.main(argv[2:])
    if argv[:1] == ["report"] and len(argv) == 2 and Path(argv[1]).is_dir():
        return render_folder(Path(argv[1]))
    if argv[:2] == ["report", "html"]:
        from te_verify.report import html

        return html.main(argv[2:])
    args, extra = build_parser().parse_known_args(argv)
    if args.command == "run":
        return run(args, extra)
    if extra:
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    return expectations_update(args)


if __name__ == "__main__":
    sys.exit(main())
