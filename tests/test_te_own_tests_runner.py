"""scripts/te_own_tests.py: outcomes read from JUnit XML, split per file when several files share one process."""
from __future__ import annotations

import os
from pathlib import Path
from loading import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "te_own_tests.py"


runner = load_file(SCRIPT, "te_own_tests", register=True)

# pytest's xunit2 JUnit XML of one process that ran two files (classname: the dotted module path [+ class]).
XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test_recipe.TestFP8Recipe" name="test_a"/>
<testcase classname="test_recipe" name="test_b"><failure message="RuntimeError: tex.gelu: not emulated 12">x</failure></testcase>
<testcase classname="nvfp4.test_nvfp4_gemm_exact" name="test_c[128]"><skipped message="needs 2 GPUs"/></testcase>
<testcase classname="test_recipe_extra" name="test_d"/>
<testcase classname="" name="test_float8_blockwise_gemm_exact"><error message="collection failure">x</error></testcase>
</testsuite></testsuites>"""


def test_rows_split_per_file(tmp_path: Path) -> None:
    xml = tmp_path / "run.xml"
    xml.write_text(XML)
    rows = runner.outcomes(xml)
    recipe = [row for row in rows if runner.in_file(row[0], "test_recipe.py")]
    assert [outcome for _, outcome, _ in recipe] == ["passed", "failed"]  # not test_recipe_extra's row
    assert recipe[1][2] == "RuntimeError: tex.gelu: not emulated N"  # numbers masked: one cause groups once
    nvfp4 = [row for row in rows if runner.in_file(row[0], "nvfp4/test_nvfp4_gemm_exact.py")]
    assert [outcome for _, outcome, _ in nvfp4] == ["skipped"]
    broken = [row for row in rows if runner.in_file(row[0], "test_float8_blockwise_gemm_exact.py")]
    assert [outcome for _, outcome, _ in broken] == ["failed"]  # an import error counts against its file
    # Node ids given instead of files: each names its own row (a class's tests included), not its file's.
    one = [row for row in rows if runner.in_file(row[0], "test_recipe.py::TestFP8Recipe::test_a")]
    assert [outcome for _, outcome, _ in one] == ["passed"]
    assert [row[1] for row in rows if runner.in_file(row[0], "nvfp4/test_nvfp4_gemm_exact.py::test_c[128]")] == [
        "skipped"]


def test_missing_xml_reports_nothing(tmp_path: Path) -> None:
    assert runner.outcomes(tmp_path / "absent.xml") == []  # a process killed before writing: no verdict


SHIM = Path(__file__).resolve().parent.parent / "scripts" / "te_own_tests_shim.py"


class Crash:
    """A failed phase's longrepr as pytest gives it: its crash line is what JUnit's message holds."""

    def __init__(self, message: str) -> None:
        self.reprcrash = type("ReprCrash", (), {"message": message})()


def phase(nodeid: str, when: str, outcome: str, longrepr=None):
    return type("Report", (), {"nodeid": nodeid, "when": when, "outcome": outcome, "longrepr": longrepr,
                               "passed": outcome == "passed", "skipped": outcome == "skipped"})()


def test_a_process_killed_before_its_xml_still_counts_what_finished(tmp_path: Path, monkeypatch) -> None:
    """The shim's progress file, written as each test ends, stands in for the XML a killed process never wrote."""
    shim = load_file(SHIM, "te_own_tests_shim_progress")
    xml = tmp_path / "nvfp4__test_nvfp4_module_exact.py.xml"
    monkeypatch.setenv(shim.PROGRESS_ENV, str(xml.with_suffix(".progress.jsonl")))
    module = "nvfp4/test_nvfp4_module_exact.py"
    for report in (phase(f"{module}::test_a[512]", "setup", "passed"),  # left out: a passed set-up
                   phase(f"{module}::test_a[512]", "call", "failed", Crash("AssertionError: mismatch at step 2")),
                   phase(f"{module}::test_b[fp32]", "setup", "skipped", ("x.py", 1, "Skipped: RHT needs bf16")),
                   phase(f"{module}::TestC::test_c", "call", "passed"),
                   phase(f"{module}::TestC::test_c", "teardown", "failed", Crash("RuntimeError: leak 1"))):
        shim.pytest_runtest_logreport(report)
    with open(xml.with_suffix(".progress.jsonl"), "a") as progress:
        progress.write('{"nodeid": "nvfp4/test_nvfp4_module_exact.py::test_d", "wh')  # the kill's torn line
    rows = runner.outcomes(xml)
    assert rows == [("nvfp4.test_nvfp4_module_exact::test_a[512]", "failed", "AssertionError: mismatch at step N"),
                    ("nvfp4.test_nvfp4_module_exact::test_b[fp32]", "skipped", "Skipped: RHT needs bfN"),
                    ("nvfp4.test_nvfp4_module_exact.TestC::test_c", "failed", "RuntimeError: leak N")]
    assert all(runner.in_file(test_id, module) for test_id, _, _ in rows)


def test_the_xml_wins_over_the_progress_file(tmp_path: Path) -> None:
    xml = tmp_path / "run.xml"
    xml.write_text(XML)
    xml.with_suffix(".progress.jsonl").write_text('{"nodeid": "x.py::t", "when": "call", "outcome": "failed", '
                                                  '"message": "stale"}\n')
    assert len(runner.outcomes(xml)) == 5


def environments_of_test_processes(monkeypatch) -> list[dict]:
    """Popen replaced by a process that records its environment and exits 0 at once."""
    seen: list[dict] = []

    class Process:
        def __init__(self, command, cwd, env, stdout, stderr) -> None:
            seen.append(env)

        def wait(self, timeout=None) -> int:
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Process)
    return seen


def test_cublaslt_option_reaches_the_test_process(tmp_path: Path, monkeypatch) -> None:
    """--cublaslt 13.3 sets the emulation's TE_VERIFY_CUBLASLT in the pytest process's environment."""
    (tmp_path / "utils.py").write_text("")
    seen = environments_of_test_processes(monkeypatch)
    monkeypatch.delenv("TE_VERIFY_CUBLASLT", raising=False)
    runner.main(["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out"), "--cublaslt", "13.3"])
    runner.main(["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out")])
    assert seen[0]["TE_VERIFY_CUBLASLT"] == "13.3" and "TE_VERIFY_CUBLASLT" not in seen[1]


def test_keep_freed_memory_reaches_the_process_unless_the_user_set_it(tmp_path: Path, monkeypatch) -> None:
    """--keep-freed-memory gives the test process glibc's thresholds that keep freed memory for reuse, a MALLOC_*
    value set by the user reaching it unchanged; without the flag none is set."""
    (tmp_path / "utils.py").write_text("")
    seen = environments_of_test_processes(monkeypatch)
    for name in runner.KEEP_FREED_MEMORY:
        monkeypatch.delenv(name, raising=False)
    keep = ["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out"), "--keep-freed-memory"]
    runner.main(keep[:-1])
    runner.main(keep)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    runner.main(keep)
    assert not set(runner.KEEP_FREED_MEMORY) & set(seen[0])
    assert {name: seen[1][name] for name in runner.KEEP_FREED_MEMORY} == runner.KEEP_FREED_MEMORY
    assert seen[2]["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_malformed_cublaslt_option_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "utils.py").write_text("")
    try:
        runner.main(["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out"), "--cublaslt", "13.x"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("--cublaslt 13.x was accepted")
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--cublaslt" in error and "'13.x'" in error


def test_triton_site_reaches_the_test_process(tmp_path: Path, monkeypatch) -> None:
    """--triton-site DIR puts DIR on the test process's PYTHONPATH (after the project's) with the interpreter and
    the emulation's real-triton mode switched on; without it none of the three is set."""
    (tmp_path / "utils.py").write_text("")
    site = tmp_path / "site"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("")
    seen = environments_of_test_processes(monkeypatch)
    for name in ("TE_VERIFY_TE_TRITON", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    args = ["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out")]
    runner.main(args + ["--triton-site", str(site)])
    runner.main(args)
    assert (seen[0]["TE_VERIFY_TE_TRITON"], seen[0]["TRITON_INTERPRET"]) == ("interpret", "1")
    assert seen[0]["PYTHONPATH"].split(os.pathsep)[-1] == str(site.resolve()), seen[0]["PYTHONPATH"]
    assert not {"TE_VERIFY_TE_TRITON", "TRITON_INTERPRET"} & set(seen[1])
    assert str(site.resolve()) not in seen[1]["PYTHONPATH"]


def test_triton_site_without_triton_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "utils.py").write_text("")
    try:
        runner.main(["test_x.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out"), "--triton-site",
                     str(tmp_path)])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("a folder without triton was accepted")
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--triton-site" in error and "no triton package" in error, error


def test_test_modules_see_the_booted_capability(tmp_path: Path, monkeypatch) -> None:
    """The rewritten test modules' torch.cuda is made after the boot: at sm100 they read (10, 0), as TE's code does
    (a shim made at import answered the default sm90)."""
    import sys
    import types

    from te_verify.te.tecpu import device

    shim = load_file(SHIM, "te_own_tests_shim_capability")
    saved = device.capability_name()
    monkeypatch.setenv(shim.TESTS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(shim.CAPABILITY_ENV, "sm100")
    monkeypatch.setattr(shim, "tecpu", types.SimpleNamespace(boot=device.configure))
    monkeypatch.setattr(shim.te_checkpoint_cpu, "apply", lambda: None)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    try:
        shim.pytest_configure(None)
        assert shim.TestsLoader.shim.cuda.get_device_capability() == (10, 0)
    finally:
        device.configure(saved)


class Ran:
    """subprocess.run as prepare() calls it, recording the command; `exit` is the script's exit status, and a run
    that succeeds writes the folder, as the checkpoint script does."""

    def __init__(self, exit: int) -> None:
        self.exit, self.commands = exit, []

    def __call__(self, command, cwd, env, stdout, stderr):
        self.commands.append((command, env["NVTE_TEST_CHECKPOINT_ARTIFACT_PATH"]))
        Path(env["NVTE_TEST_CHECKPOINT_ARTIFACT_PATH"]).mkdir(parents=True)
        return type("Done", (), {"returncode": self.exit})()


def test_te_cis_step_runs_once_before_its_file(tmp_path: Path, monkeypatch) -> None:
    """test_checkpoint.py loads checkpoints TE's CI writes first with the build under test: the runner points the
    test at a folder under --out and fills it by the file's own save mode, once; other files get no step."""
    ran = Ran(exit=0)
    monkeypatch.setattr(runner.subprocess, "run", ran)
    env: dict[str, str] = {}
    with open(tmp_path / "log", "w") as log:
        runner.prepare(["test_recipe.py", "test_checkpoint.py::TestLoadCheckpoint::test_module[linear]"],
                       tmp_path, env, tmp_path, log)
        runner.prepare(["test_checkpoint.py"], tmp_path, env, tmp_path, log)  # the folder is there: not again
    folder = str(tmp_path / "artifacts" / "test_checkpoint")
    assert env == {"NVTE_TEST_CHECKPOINT_ARTIFACT_PATH": folder}
    assert [command[-4:] for command, _ in ran.commands] == [
        ["te_own_tests_shim", "test_checkpoint", "--save-checkpoint", "all"]]


def test_a_failed_ci_step_is_logged_and_tried_again(tmp_path: Path, monkeypatch) -> None:
    ran = Ran(exit=1)
    monkeypatch.setattr(runner.subprocess, "run", ran)
    with open(tmp_path / "log", "w") as log:
        runner.prepare(["test_checkpoint.py"], tmp_path, {}, tmp_path, log)
    assert not (tmp_path / "artifacts" / "test_checkpoint").exists()  # the tests fail on what is missing
    assert "test_checkpoint.py --save-checkpoint all, exit 1" in (tmp_path / "log").read_text()


def test_a_name_without_rows_says_no_result(tmp_path: Path, capsys) -> None:
    """A node id pytest did not find (a path relative to the wrong folder) or never reached has no row: no verdict,
    not '0 passed, 0 failed'."""
    runner.report("test_nvfp4_sr_quantize.py::test_a[1]", [], tmp_path, by_cause=False)
    assert "no result" in capsys.readouterr().out
    assert "0 passed" not in (tmp_path / "summary.txt").read_text()
