"""One axis of the version matrix: the lanes a package serves, run against several of its releases, and compared.

    .venv/bin/python scripts/version_axis.py deepspeed 0.19.7 0.19.8 [--tier smoke] [--out reports/versions]

For each release: `pip install --no-deps --target .versions/<package>-<release>` (once; DeepSpeed without its CUDA
ops), then that package's case files and backends (AXES) with the folder first on PYTHONPATH (its code and
dist-info shadow the pinned release), one report per release under <out>/<package>/<release>. Then gaps.md: for every
known-gap entry, how its cases ended in each release (xfailed: the gap holds; xpassed: it does not; failed: the case
failed otherwise), and each release's totals. A release outside the measured range runs with the header's
unmeasured-version warning (te_verify/compat/versions.py); docs/versions.md holds the tables. TE's axis is
scripts/te_versions.py (its releases need a tex surface); torch's are whole environments (scripts/bootstrap.sh).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"
# package -> (case files, backends): what the package's releases change.
AXES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lightning-thunder": (("cases/test_freeze.py", "cases/test_te_peft.py", "cases/test_dist_thunder_ddp.py",
                           "cases/test_dist_thunder_fsdp.py"), ("thunder", "thunder_te", "thunder_ddp", "thunder_fsdp")),
    "deepspeed": (("cases/test_dist_deepspeed.py",), ("deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3")),
    "megatron-core": (("cases/test_dist_megatron_ddp.py", "cases/test_dist_te_megatron.py"), ("megatron_ddp",)),
    "megatron-fsdp": (("cases/test_dist_megatron_fsdp.py",), ("megatron_fsdp",)),
    "fairscale": (("cases/test_dist_fairscale.py",), ("fairscale_fsdp",)),
}


def install(package: str, release: str) -> Path:
    target = ROOT / ".versions" / f"{package}-{release}"
    if not any(target.glob("*.dist-info")):
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        f"{package}=={release}"], check=True, env=env)
    return target


def run_axis(package: str, release: str, target: Path, tier: str, out: Path, workers: str) -> Path:
    """The package's cases against `release`; its results.json (SystemExit naming the release if none was written)."""
    files, backends = AXES[package]
    report = out / package / release
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    cmd = [str(PYTHON), "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-W", "ignore", "-n", workers,
           "--tier", tier, "--te-capability", "sm90", "--report-dir", str(report)]
    for backend in backends:
        cmd += ["--backend", backend]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if not (report / "results.json").exists():
        raise SystemExit(f"version_axis: {package} {release}: {(proc.stdout + proc.stderr).strip().splitlines()[-1]}")
    return report / "results.json"


def totals(results: Path) -> str:
    counts = collections.Counter(r["outcome"] for r in json.loads(results.read_text())["rows"])
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


def gaps_table(label: str, results: dict[str, Path], with_totals: bool = True) -> str:
    """Markdown: one row per known gap (its cases' outcomes per release; a failure no entry covers in a row of its
    own, where a gap's entry does not hold in that release), then each release's totals. `label` heads the columns
    ("TE" for "TE 2.14.0")."""
    cells: dict[tuple[str, str], dict[str, collections.Counter]] = collections.defaultdict(
        lambda: collections.defaultdict(collections.Counter))
    for release, path in results.items():
        for row in json.loads(path.read_text())["rows"]:
            exp = row.get("expectation")
            if exp and row["outcome"] in ("xfailed", "xpassed", "failed"):
                cells[(f"{row['backend']}: {exp['reason']}", exp["link"])][release][row["outcome"]] += 1
            elif row["outcome"] == "failed":
                cells[(f"{row['backend']}: {row['family']}: failed, no known gap", "-")][release]["failed"] += 1
    releases = list(results)
    lines = ["| known gap | link | " + " | ".join(f"{label} {r}" for r in releases) + " |",
             "|---|---|" + "---|" * len(releases)]
    for (reason, link), per in sorted(cells.items()):
        counts = [", ".join(f"{n} {o}" for o, n in sorted(per[r].items())) or "-" for r in releases]
        lines.append(f"| {reason} | {link} | " + " | ".join(counts) + " |")
    if with_totals:
        lines.append("| all cases | | " + " | ".join(totals(results[r]) for r in releases) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", choices=sorted(AXES))
    parser.add_argument("releases", nargs="+")
    parser.add_argument("--tier", default="smoke")
    parser.add_argument("--workers", default="1", help="pytest-xdist workers per release (default 1)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "versions"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    results = {}
    for release in args.releases:
        try:
            results[release] = run_axis(args.package, release, install(args.package, release), args.tier, out,
                                        args.workers)
        except (SystemExit, subprocess.CalledProcessError) as exc:
            print(f"{args.package} {release}: did not run: {exc}")
            continue
        print(f"{args.package} {release}: {totals(results[release])} ({results[release]})")
    if results:
        (out / args.package).mkdir(parents=True, exist_ok=True)
        (out / args.package / "gaps.md").write_text(gaps_table(args.package, results))
        print(f"known gaps by release: {out / args.package / 'gaps.md'}")
    return 0 if len(results) == len(args.releases) else 1


if __name__ == "__main__":
    sys.exit(main())
