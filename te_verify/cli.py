"""te-verify: run the cases and write the report (more subcommands: report diff/html, expectations update)."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "cases"


def default_report_dir() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return ROOT / "reports" / stamp


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Run cases/ under pytest with xdist; 0 only when nothing unexpectedly failed."""
    import pytest

    report_dir = Path(args.report_dir) if args.report_dir else default_report_dir()
    argv = [str(CASES), "-q", "-p", "no:cacheprovider", "--tier", args.tier, "--report-dir", str(report_dir),
            "--junitxml", str(report_dir / "junit.xml"), "-n", str(args.workers)]
    for backend in args.backend:
        argv += ["--backend", backend]
    if args.te_impl:
        argv += ["--te-impl", args.te_impl]
    code = pytest.main(argv + extra)
    print(f"te-verify: report in {report_dir}")
    return int(code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="te-verify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a tier of cases and write the report; extra args go to pytest")
    run_p.add_argument("--tier", default="pr", choices=("smoke", "pr", "nightly"))
    run_p.add_argument("--backend", action="append", default=[], help="built-in name or package.module:attr")
    run_p.add_argument("--report-dir", default=None, help="default: reports/<timestamp>")
    run_p.add_argument("--te-impl", default=None, help="reference, transformer_engine or package.module")
    run_p.add_argument("--workers", default=str(os.cpu_count() or 1), help="pytest-xdist workers (-n)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if args.command == "run":
        return run(args, extra)
    raise SystemExit(f"te-verify: unknown command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
