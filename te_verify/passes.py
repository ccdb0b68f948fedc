"""`te-verify run --passes` (the main job) on an emulated device: one pytest run per capability and environment,
one report.

On a CPU machine the compute capability is the emulation's choice (te_verify.matrix.capability says which TE cases
run at which), and TE's torch.compile path needs a newer torch than the one every other lane runs on: thunder 0.2.6,
the newest release, does not import on torch >= 2.14 (lightning-thunder#2833), so the pinned stack stays on torch
2.13 and TE's compiled path runs in a second environment (.venv-compile, `scripts/bootstrap.sh --compile`). The passes:

- `sm90`: every selected backend's cases but torch_compile_te's where the compile environment serves it;
- `sm100`: the TE cases that run at sm100 (MXFP8, NVFP4, the custom recipe; grouped modules under FP8 at both);
- `compile-sm90`, `compile-sm100`: torch_compile_te in the compile environment, at each capability.

Each writes <report>/passes/<name>; then they are merged into <report> (te_verify.report.merge). A run that names a
capability (`--te-capability` among the pytest arguments), resumes, or has a GPU (the hardware decides) is one pass.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from te_verify.matrix.capability import DEFAULT

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES = (DEFAULT, "sm100")
COMPILE_BACKENDS = ("torch_compile_te", "torch_compile_te_inductor")
# The environment where TE's compiled path runs; TE_VERIFY_COMPILE_PYTHON names another interpreter.
COMPILE_PYTHON = ROOT / ".venv-compile" / "bin" / "python"
NO_TESTS = 5  # pytest's exit status when a pass collected nothing


@dataclass(frozen=True)
class Pass:
    """One pytest run of the main job."""

    # Sub-folder of the report and the header's `pass`.
    name: str
    # The interpreter it runs under (this one, or the compile environment's).
    python: str
    # The emulated compute capability.
    capability: str
    # --backend values (built-in names or package.module:attr).
    backends: tuple[str, ...]


def compile_python() -> str | None:
    """The compile environment's interpreter, when it exists."""
    path = Path(os.environ.get("TE_VERIFY_COMPILE_PYTHON") or COMPILE_PYTHON)
    return str(path) if path.exists() else None


def plan(backends: list[str], here_lacks_compile_api: bool, compile_env: str | None) -> list[Pass]:
    """The passes for `backends`: every capability here; the compile backends in the compile environment where this
    torch lacks TE's compile API and that environment exists."""
    moved = tuple(b for b in backends if b in COMPILE_BACKENDS) if here_lacks_compile_api and compile_env else ()
    stay = tuple(b for b in backends if b not in moved)
    passes = [Pass(cap, sys.executable, cap, stay) for cap in CAPABILITIES if stay]
    passes += [Pass(f"compile-{cap}", compile_env, cap, moved) for cap in CAPABILITIES if moved]
    return passes


def command(p: Pass, args: list[str], report: Path) -> list[str]:
    """The pass's te-verify run: the run's own arguments (tier, shard, workers, ...), its backends, its capability;
    the longest cases first (te_verify.matrix.case_order's `cost`) unless the run names an order."""
    order = [] if any(a.startswith("--case-order") for a in args) else ["--case-order", "cost"]
    cmd = [p.python, "-m", "te_verify.cli", "run", *args, *order, "--report-dir", str(report)]
    for backend in p.backends:
        cmd += ["--backend", backend]
    return cmd + ["--te-capability", p.capability, "--capability-cases", "--pass-name", p.name]


def exit_status(codes: list[int]) -> int:
    """The run's status: a failing pass's, else 0; NO_TESTS only when no pass collected anything."""
    ran = [c for c in codes if c != NO_TESTS]
    if not ran:
        return NO_TESTS
    return next((c for c in ran if c != 0), 0)


def run_passes(passes: list[Pass], args: list[str], report_dir: Path) -> int:
    """Run every pass into report_dir/passes/<name>, merge them into report_dir; the run's exit status."""
    from te_verify.report.merge import MergeError, merge

    folders, codes = [], []
    for p in passes:
        folder = report_dir / "passes" / p.name
        print(f"te-verify: pass {p.name}: {', '.join(p.backends)} at emulated {p.capability} ({p.python})", flush=True)
        codes.append(subprocess.run(command(p, args, folder), cwd=ROOT).returncode)
        if (folder / "results.json").exists():
            folders.append(folder)
    if not folders:
        return exit_status(codes) or 4
    try:
        merge(folders, report_dir)
    except MergeError as exc:
        print(f"ERROR: merging the passes: {exc}", file=sys.stderr)
        return 2
    print(f"te-verify: report in {report_dir} ({len(folders)} passes merged)")
    return exit_status(codes)
