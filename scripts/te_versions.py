"""Run the TE lane against several TE versions, each in its own environment, and compare them.

    .venv/bin/python scripts/te_versions.py 2.14.0 2.20.2 [--tier pr] [--out reports/te_versions]
        [--workers N (default $TE_VERSIONS_WORKERS, else 2)] [--backend te_eager ...]

For each version: `pip install --no-deps --target .te-versions/<version> transformer-engine==<version>` (once),
then the TE families with that directory first on PYTHONPATH (its TE Python and dist-info shadow the pinned one;
the tex emulation serves it from surfaces/tex_<version>.json), writing one report per version to <out>/<version>.
Then `te-verify report diff` of the first and the last version, and gaps.md: for every known-gap entry, how its
cases ended in each version (xfailed: the gap holds; xpassed: it does not; failed: the case failed otherwise), and per
family the failures no known gap covers.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: version_axis beside it
import version_axis  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)  # the interpreter this script runs under (.venv's, or a worktree's shared one)
BACKENDS = ("te_eager", "thunder_te")
TE_CASES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cases").glob("test_te_*.py"))


def install(version: str) -> Path:
    target = ROOT / ".te-versions" / version
    if not (target / f"transformer_engine-{version}.dist-info").exists():
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        f"transformer-engine=={version}"], check=True)
    return target


def run_lane(version: str, target: Path, tier: str, out: Path, workers: int, backends: list[str]) -> Path:
    report = out / version
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    cmd = [str(PYTHON), "-m", "pytest", *TE_CASES, "-q", "-p", "no:cacheprovider", "-W", "ignore", "-n", str(workers),
           "--tier", tier, *(a for b in backends for a in ("--backend", b)), "--report-dir", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if not (report / "results.json").exists():  # a version the emulation cannot serve stops at start, in one line
        raise SystemExit(f"te_versions: TE {version}: {(proc.stdout + proc.stderr).strip().splitlines()[-1]}")
    return report / "results.json"


def outcomes(results: Path) -> collections.Counter:
    return collections.Counter(r["outcome"] for r in json.loads(results.read_text())["rows"])


def gaps_table(results: dict[str, Path]) -> str:
    """Markdown: one row per known-gap reason and link, one column per version (version_axis.gaps_table)."""
    return version_axis.gaps_table("TE", results, with_totals=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+")
    parser.add_argument("--tier", default="pr")
    parser.add_argument("--out", default=str(ROOT / "reports" / "te_versions"))
    # a shared machine runs with fewer xdist workers than the default 2
    parser.add_argument("--workers", type=int, default=int(os.environ.get("TE_VERSIONS_WORKERS", "2")))
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable; default: both")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()  # the diff runs from ROOT
    results = {v: run_lane(v, install(v), args.tier, out, args.workers, args.backend or list(BACKENDS))
               for v in args.versions}
    for version, path in results.items():
        print(f"TE {version}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes(path).items())) + f" ({path})")
    (out / "gaps.md").write_text(gaps_table(results))
    print(f"known gaps by version: {out / 'gaps.md'}")
    if len(results) > 1:
        first, last = results[args.versions[0]], results[args.versions[-1]]
        subprocess.run([str(PYTHON), "-m", "te_verify.cli", "report", "diff", str(first), str(last)],
                       cwd=ROOT, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
