"""`te-verify report merge R1 R2 ... --out R`: shard reports (`--shard K/N` runs) put back together as one report.

Each input is a report folder (or its results.json). The rows are concatenated; a case (nodeid) present in two
inputs is an error naming it and both inputs, as are inputs of different tiers or shard counts. The merged
header keeps the first input's versions and lists every input (run id, shard, device). A K/N split with shards
absent is merged anyway, the missing shards named and the exit status 1. summary.md, report.html and the repro
scripts are rendered from the merged rows; junit.xml joins the inputs' test cases in one suite when every
input has one. Exit 0: merged; 1: shards missing; 2: bad input (one line naming it).
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from te_verify.report.results import ResultsError, load_results, write_atomic
from te_verify.report.stream import STREAM, StreamError, partial_results
from te_verify.report.writer import write_report

JUNIT_COUNTS = ("tests", "errors", "failures", "skipped")


class MergeError(ValueError):
    """Inputs that cannot be merged; the message is one line naming the culprit."""


@dataclass(frozen=True)
class ShardReport:
    """One input: where it came from and its results."""

    # The folder holding results.json (and junit.xml when the run wrote one).
    folder: Path
    # The parsed results.json.
    results: dict


def load_report(path: Path) -> ShardReport:
    """A report folder or its results.json; a killed shard's folder (rows.jsonl, no results.json) as its partial
    run; MergeError when it is not a te_verify report."""
    results_path = path / "results.json" if path.is_dir() else path
    if path.is_dir() and not results_path.exists() and (path / STREAM).exists():
        try:
            return ShardReport(path, partial_results(path))
        except StreamError as exc:
            raise MergeError(str(exc)) from None
    try:
        return ShardReport(results_path.parent, load_results(results_path))
    except ResultsError as exc:
        raise MergeError(str(exc).splitlines()[0]) from None


def _check_compatible(reports: list[ShardReport]) -> None:
    """One tier, each shard once, one K/N split."""
    first, tier = reports[0], reports[0].results["header"].get("tier")
    for report in reports[1:]:
        if report.results["header"].get("tier") != tier:
            raise MergeError(f"{report.folder}: tier {report.results['header'].get('tier')!r} differs from "
                             f"{first.folder}'s {tier!r}")
    seen: dict[tuple[str | None, str], Path] = {}
    for report in reports:  # a shard once per pass (te-verify run's capability and environment passes)
        header = report.results["header"]
        shard, key = header.get("shard"), (header.get("pass"), header.get("shard"))
        if shard is not None and key in seen:
            raise MergeError(f"shard {shard}{_of_pass(key[0])} is in both {seen[key]} and {report.folder}")
        if shard is not None:
            seen[key] = report.folder
    if len({shard.split("/")[1] for _, shard in seen}) > 1:
        raise MergeError(f"shards of different splits: {', '.join(sorted({shard for _, shard in seen}))}")


def _of_pass(name: str | None) -> str:
    return f" of pass {name}" if name else ""


def merged_rows(reports: list[ShardReport]) -> list[dict]:
    """Every input's rows; a nodeid in two inputs is refused naming it."""
    owner: dict[str, Path] = {}
    rows = []
    for report in reports:
        for row in report.results["rows"]:
            if "nodeid" not in row:
                raise MergeError(f"{report.folder}: a row without a nodeid: {str(row)[:120]}")
            if row["nodeid"] in owner:
                raise MergeError(f"case {row['nodeid']} is in both {owner[row['nodeid']]} and {report.folder}")
            owner[row["nodeid"]] = report.folder
            rows.append(row)
    return rows


def missing_shards(reports: list[ShardReport]) -> list[str]:
    """The K/N labels of a split that no input holds."""
    shards = [r.results["header"].get("shard") for r in reports if r.results["header"].get("shard")]
    if not shards:
        return []
    total = int(shards[0].split("/")[1])
    return [f"{k}/{total}" for k in range(1, total + 1) if f"{k}/{total}" not in shards]  # in any pass


def merged_header(reports: list[ShardReport]) -> dict:
    headers = [r.results["header"] for r in reports]
    header = dict(headers[0])
    header.update(
        run_id="+".join(str(h.get("run_id")) for h in headers),
        started=min(str(h.get("started", "")) for h in headers),
        finished=max(str(h.get("finished", "")) for h in headers),
        shard=None,
        shards=sorted(h["shard"] for h in headers if h.get("shard")),
        merged_from=[{"source": str(r.folder), "run_id": h.get("run_id"), "shard": h.get("shard"),
                      "pass": h.get("pass"), "te_capability": h.get("te_capability"), "device": h.get("device"),
                      "versions": h.get("versions"), "te_compile": h.get("te_compile")}
                     for r, h in zip(reports, headers)],
        passes=sorted({h["pass"] for h in headers if h.get("pass")}),
        devices=sorted({d for h in headers for d in h.get("devices") or []}),
        compat=sorted({step for h in headers for step in h.get("compat") or []}),
        unmeasured_versions=sorted({line for h in headers for line in h.get("unmeasured_versions") or []}),
        backends={k: v for h in headers for k, v in (h.get("backends") or {}).items()},
        backend_paths={k: v for h in headers for k, v in (h.get("backend_paths") or {}).items()},
    )
    _per_pass(header, headers, "te_compile")  # the compile environment's torch has TE's compile path, sm90's not
    partial = [h["incomplete"] for h in headers if h.get("incomplete")]
    header.pop("incomplete", None)
    if partial:  # a killed shard: the merge is incomplete by what it never ran
        header["incomplete"] = {"ran": sum(len(r.results["rows"]) for r in reports),
                                "selected": None if any(p["selected"] is None for p in partial) else
                                sum(len(r.results["rows"]) for r in reports) + sum(len(p["never_ran"]) for p in partial),
                                "never_ran": [n for p in partial for n in p["never_ran"]],
                                "why": "; ".join(dict.fromkeys(p["why"] for p in partial if p.get("why"))) or None}
    return header


def _per_pass(header: dict, headers: list[dict], key: str) -> None:
    """A header line that differs between passes is kept per pass ("pass sm90: ... | pass compile-sm90: ...")."""
    lines = {h.get("pass") or h.get("run_id"): h.get(key) for h in headers if h.get(key)}
    if len(set(lines.values())) > 1:
        header[key] = " | ".join(f"pass {name}: {line}" for name, line in lines.items())


def merge_junit(reports: list[ShardReport], out: Path) -> bool:
    """One junit.xml with every input's test cases in one suite; False (nothing written) when an input has none."""
    sources = [r.folder / "junit.xml" for r in reports]
    if not all(p.is_file() for p in sources):
        return False
    suite = ET.Element("testsuite", name="pytest")
    totals = dict.fromkeys(JUNIT_COUNTS, 0)
    elapsed = 0.0
    for path in sources:
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as exc:
            raise MergeError(f"{path}: not JUnit XML: {exc}") from None
        for part in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
            for key in JUNIT_COUNTS:
                totals[key] += int(part.get(key, 0))
            elapsed += float(part.get("time", 0.0))
            suite.extend(part.findall("testcase"))
    suite.attrib.update({k: str(v) for k, v in totals.items()}, time=f"{elapsed:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    write_atomic(out / "junit.xml", ET.tostring(root, encoding="unicode"))
    return True


def merge(paths: list[Path], out: Path) -> list[str]:
    """Write the merged report to `out`; the shards missing from a K/N split (empty when complete)."""
    reports = [load_report(p) for p in paths]
    _check_compatible(reports)
    rows = merged_rows(reports)
    header = merged_header(reports)
    write_report(out, {"schema_version": 1, "header": header, "rows": rows}, header["backend_paths"])
    if not merge_junit(reports, out):
        print("te-verify report merge: junit.xml not merged: an input has none", file=sys.stderr)
    return missing_shards(reports)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="te-verify report merge", description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="shard report folders (or their results.json)")
    parser.add_argument("--out", type=Path, required=True, help="folder of the merged report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        missing = merge(args.reports, args.out)
    except MergeError as exc:
        print(f"te-verify report merge: {exc}", file=sys.stderr)
        return 2
    print(f"te-verify report merge: {len(args.reports)} reports -> {args.out / 'results.json'}")
    if missing:
        print(f"te-verify report merge: shard(s) {', '.join(missing)} missing; their cases are absent", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
