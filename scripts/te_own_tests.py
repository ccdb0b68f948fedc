"""Run TransformerEngine's own tests/pytorch over the tex emulation, one file at a time, and sort what fails.

    .venv/bin/python scripts/te_own_tests.py --tests /tmp/te-tests/tests/pytorch --out /tmp/te-own \
        test_quantized_tensor.py nvfp4/test_nvfp4_module_exact.py -- -k "not LayerNorm"

TE's tests are not part of the project: fetch TE's repository (github:NVIDIA/TransformerEngine) and point --tests at
its tests/pytorch. Each file runs in its own pytest process (scripts/te_own_tests_shim.py boots the emulation and
rewrites the tests' CUDA touch points), nice'd, on one core, with a time limit (at which pytest is interrupted and
still reports what it finished), after the step TE's CI takes before the file, if it has one (CI_STEPS);
`--one-process` runs all files in one process instead, paying TE's import once (on a loaded machine it dominates
small files). Per file it writes one summary line, from the JUnit XML; `--by-cause` prints the failures grouped by
their error's first line, the start of sorting each into the emulation's, the shim's or a GPU-only feature
(docs/te-lane.md).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
INTERRUPT_GRACE_S = 120  # after SIGINT, pytest finishes its report; then the process is killed


class CiStep(NamedTuple):
    """What TE's CI does before a test file (qa/L0_pytorch_unittest/test.sh): points `env` at a folder under --out
    and, where it is absent, fills it by running the file as a script with `argv` (over the emulation, as the tests)."""
    env: str
    argv: tuple[str, ...]


CI_STEPS = {
    # The checkpoints test_checkpoint.py loads; TE's CI writes them with the build under test when absent.
    "test_checkpoint.py": CiStep("NVTE_TEST_CHECKPOINT_ARTIFACT_PATH", ("--save-checkpoint", "all")),
}


def prepare(names: list[str], out: Path, env: dict[str, str], cwd: Path, log) -> None:
    """TE CI's steps for the files in `names` (CI_STEPS), into env and out/artifacts/<file>."""
    for name in names:
        file = name.split("::")[0]  # a node id's file
        step = CI_STEPS.get(file)
        if step is None:
            continue
        folder = out / "artifacts" / Path(file).stem
        env[step.env] = str(folder)
        if not folder.is_dir():
            module = file.removesuffix(".py").replace("/", ".")
            done = subprocess.run([sys.executable, "-m", "te_own_tests_shim", module, *step.argv], cwd=cwd, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
            log.write(f"te_own_tests: TE CI's step for {name}: {module}.py {' '.join(step.argv)}, exit {done.returncode}\n")
            log.flush()
            if done.returncode:  # the tests then fail on what is missing; the next run tries again
                shutil.rmtree(folder, ignore_errors=True)


# --keep-freed-memory: glibc maps every allocation above 32 MB afresh and unmaps it when freed, so a large item pays
# a page fault per 4 KB of each temporary; kept in the heap, freed memory is reused. It depends on the test: TE's
# NVFP4 8192 x 8192 quantization item 7.6 -> 1.4 s in the kernel, 1.9 -> 2.8 GB peak; a fused RoPE item at
# sequence 4096, hidden 256: 21 -> 10 s, 4 -> 12 GB (the heap fragments), which ran a 24 GB machine out of memory
# beside other runs. Opt-in; a MALLOC_* value the user set wins (docs/te-lane.md).
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(16 << 30), "MALLOC_TRIM_THRESHOLD_": str(64 << 30),
                     "MALLOC_TOP_PAD_": str(1 << 30)}


def run_files(tests: Path, names: list[str], out: Path, capability: str, limit_s: int, niceness: int,
              extra: list[str], options: dict[str, str] | None = None, paths: tuple[str, ...] = ()) -> Path:
    """TE test files in one nice'd pytest process, `options` (option_env) in its environment and `paths` on its
    PYTHONPATH after the project's; returns its JUnit XML path.

    At the time limit the process gets SIGINT, as Ctrl-C: pytest stops at the running test and still writes the
    JUnit XML of the tests it finished; a process killed before its XML still leaves the shim's progress file (every
    finished test, written as it ends; outcomes() reads it)."""
    stem = names[0].replace("/", "__") + (f"+{len(names) - 1}" if len(names) > 1 else "")
    xml = out / (stem + ".xml")
    progress = xml.with_suffix(".progress.jsonl")
    progress.unlink(missing_ok=True)
    env = dict(os.environ, TE_OWN_TESTS_DIR=str(tests), TE_OWN_TESTS_CAPABILITY=capability,
               TE_OWN_TESTS_PROGRESS=str(progress),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "scripts"), *paths]), OMP_NUM_THREADS="1")
    env.update(options or {})
    command = ["nice", "-n", str(niceness), sys.executable, "-m", "pytest", "-p", "te_own_tests_shim",
               "-p", "no:te_verify", "-p", "no:cacheprovider", "--assert=plain", "-q", "--tb=short",
               "--continue-on-collection-errors",
               f"--junitxml={xml}", *names, *extra]
    with open(out / (stem + ".log"), "w") as log:
        prepare(names, out, env, tests, log)
        process = subprocess.Popen(command, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.write(f"\nte_own_tests: stopped after {limit_s} s\n")
    return xml


def outcomes(xml: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, the error's first line) per test case of a JUnit XML file; where the process died before
    writing it, from the shim's progress file beside it (every test that finished)."""
    if not xml.exists():
        return progress_outcomes(xml.with_suffix(".progress.jsonl"))
    rows = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            rows.append((test_id, "failed", _first_line(bad.get("message") or bad.text or "")))
        elif case.find("skipped") is not None:
            rows.append((test_id, "skipped", _first_line(case.find("skipped").get("message") or "")))
        else:
            rows.append((test_id, "passed", ""))
    return rows


def progress_outcomes(progress: Path) -> list[tuple[str, str, str]]:
    """(test id as JUnit writes it, outcome, the error's first line) per test of the shim's progress file: failed if
    any phase failed, skipped if one skipped, else passed; [] when there is none."""
    if not progress.exists():
        return []
    tests: dict[str, tuple[str, str]] = {}
    for line in progress.read_text().splitlines():
        try:
            phase = json.loads(line)
        except json.JSONDecodeError:  # the line being written when the process was killed
            continue
        outcome = {"passed": "passed", "skipped": "skipped"}.get(phase["outcome"], "failed")
        if tests.get(phase["nodeid"], ("passed",))[0] != "failed":
            tests[phase["nodeid"]] = (outcome, _first_line(phase["message"]) if outcome != "passed" else "")
    return [(_junit_id(nodeid), outcome, cause) for nodeid, (outcome, cause) in tests.items()]


def _junit_id(nodeid: str) -> str:
    """pytest's node id (nvfp4/test_x.py::TestA::test_b[1]) as JUnit's classname::name (nvfp4.test_x.TestA::test_b[1])."""
    path, *classes, name = nodeid.split("::")
    return "::".join([".".join([path.removesuffix(".py").replace("/", "."), *classes]), name])


def in_file(test_id: str, name: str) -> bool:
    """Whether a JUnit test id (classname::name, classname the dotted module path) is from test file `name`, or is
    the test `name` names when it is a node id. A module that fails to import is one row with an empty classname and
    the dotted module path as its name."""
    file, *classes, test = name.split("::") if "::" in name else (name, "")
    module = file.removesuffix(".py").replace("/", ".")
    if test:  # JUnit writes a node id's classes into its classname
        return test_id == ".".join([module, *classes]) + "::" + test
    classname, _, test_name = test_id.partition("::")
    classname = classname or test_name
    return classname == module or classname.startswith(module + ".")


def _first_line(message: str) -> str:
    """The error's first line with numbers masked, so one cause groups once."""
    line = message.strip().splitlines()[0] if message.strip() else "(no message)"
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", line)[:200]


def report(name: str, rows: list[tuple[str, str, str]], out: Path, by_cause: bool) -> None:
    """One file's summary line (printed and appended to summary.txt), and its failures by cause."""
    counts = collections.Counter(outcome for _, outcome, _ in rows)
    line = f"{name}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    if not rows:  # not collected (a path pytest did not find) or not reached before the time limit: no verdict
        line = f"{name}: no result (not collected, or not reached in the time limit: see the log)"
    print(line, flush=True)
    with open(out / "summary.txt", "a") as summary:
        summary.write(line + "\n")
    if by_cause:
        causes = collections.Counter(cause for _, outcome, cause in rows if outcome == "failed")
        for cause, n in causes.most_common():
            print(f"  {n:5d}  {cause}")


def cublaslt_version(text: str) -> str:
    """--cublaslt's value as given, once the emulation's parser accepts it (argparse reports its one-line error)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from te_verify.te.tecpu.device import CapabilityError, parse_cublaslt
    try:
        parse_cublaslt(text)
    except CapabilityError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def option_env(args: argparse.Namespace) -> dict[str, str]:
    """What the runner's options set in the test process's environment (a MALLOC_* value the user set wins)."""
    env: dict[str, str] = {}
    if args.keep_freed_memory:
        env.update({name: value for name, value in KEEP_FREED_MEMORY.items() if name not in os.environ})
    if args.nan_uninitialized:
        env["TE_OWN_TESTS_NAN_UNINITIALIZED"] = "1"
    if args.cublaslt:  # the emulated cuBLASLt version, read at boot (te_verify/te/tecpu/device.py CUBLASLT_ENV)
        env["TE_VERIFY_CUBLASLT"] = args.cublaslt
    if args.triton_site:  # TE's real triton kernels in triton's interpreter (te_verify/te/tecpu/real_triton.py)
        env.update(TE_VERIFY_TE_TRITON="interpret", TRITON_INTERPRET="1")
    return env


def triton_site(text: str) -> Path:
    """--triton-site: a folder holding the triton package (pip install --no-deps --target DIR triton)."""
    folder = Path(text).resolve()
    if not (folder / "triton" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text}: no triton package in it (pip install --no-deps --target "
                                         f"{text} triton; never into .venv)")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="test files relative to --tests")
    parser.add_argument("--tests", type=Path, required=True, help="TE's tests/pytorch directory")
    parser.add_argument("--out", type=Path, required=True, help="where the XML, logs and summary go")
    parser.add_argument("--capability", default="sm100", choices=("sm89", "sm90", "sm100"))
    parser.add_argument("--cublaslt", type=cublaslt_version, default=None,
                        help="the emulated cuBLASLt version tex.get_cublasLt_version reports, e.g. 13.3 (default 13.0; "
                             ">= 13.3, on sm90 >= 13.4, opens GroupedLinear's grouped-tensor GEMM path)")
    parser.add_argument("--limit-s", type=int, default=1800, help="time limit per pytest process")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the test processes (a shared machine)")
    parser.add_argument("--one-process", action="store_true",
                        help="all files in one pytest process (TE's import is paid once: a loaded machine)")
    parser.add_argument("--by-cause", action="store_true", help="print failures grouped by their first line")
    parser.add_argument("--nan-uninitialized", action="store_true",
                        help="fill uninitialized float memory with NaN (torch's deterministic mode): a read of memory "
                             "nobody wrote fails deterministically instead of by the order tests ran in")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="keep freed memory in glibc's heap for reuse: fewer page faults on large items, up to 3x "
                             "their peak memory (see KEEP_FREED_MEMORY)")
    parser.add_argument("--triton-site", type=triton_site, default=None,
                        help="a folder holding triton, outside .venv: TE's triton kernels run for real in triton's "
                             "interpreter instead of being refused (slow; te_verify/te/tecpu/real_triton.py)")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    pytest_args = argv[cut + 1:]  # after --: passed to pytest as given
    if not (args.tests / "utils.py").exists():
        parser.error(f"--tests {args.tests}: not TE's tests/pytorch (no utils.py)")
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [args.files] if args.one_process else [[name] for name in args.files]
    for batch in batches:
        rows = outcomes(run_files(args.tests.resolve(), batch, args.out, args.capability, args.limit_s, args.nice,
                                  pytest_args, option_env(args), (str(args.triton_site),) if args.triton_site else ()))
        for name in batch:
            report(name, [row for row in rows if in_file(row[0], name)], args.out, args.by_cause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
