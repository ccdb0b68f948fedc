"""Every command README.md and docs/*.md show runs as written on a fresh clone, or its smallest version does; every
relative link resolves; every repository path they name exists; every Python and TOML example parses, and a Python
example that names its file (first line `# examples/x.py`) matches it.

Each command (tests/docs_pages.py says what counts as one) is checked twice:
- statically, in this process (milliseconds): its program is one the docs may use; the repository paths it names
  exist; te-verify's, torchrun's and the torchrun entry's arguments parse with their own parsers; each pytest option
  is one this pytest knows (the te_verify plugin is loaded here); each `--backend`, `--wrap` and `--te-impl` value
  loads; `--tier`, `--shard` and `--device` values parse; a script's options are declared in it;
- by running SMALLEST[command], its smallest version, where it has one: from the checkout's root with .venv/bin first
  on PATH (what `source .venv/bin/activate` does); its exit status as stated. Every command that is not a pattern
  needs an entry (the test names a missing one); an entry of None is checked statically only, and says why. The
  runs take about 25 s of one core (three te-verify or pytest runs of a few cases, whose start-up is most of it).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from typing import NamedTuple

import pytest
from docs_pages import (PAGES, ROOT, documented, example_problems, is_pattern, link_problems, option_table,
                        path_problems, read_page, static_problems)


class Smallest(NamedTuple):
    """How a documented command is run here: `command` ({tmp}: a fresh folder; {report}: the report folder the run.sh
    entry writes, which runs first), or None for the static check only; `why` says what makes it the smallest."""

    command: str | None
    why: str
    exit_status: int = 0


RUN_SMALLEST = "--tier smoke --backend eager -k test_freeze --workers 0"
SMALLEST: dict[str, Smallest] = {
    # README: the two commands, the environment, running.
    "bash scripts/run.sh": Smallest(f"bash scripts/run.sh {RUN_SMALLEST} --report-dir {{report}}",
                                    "the pr tier takes minutes: the script, bootstrap and CLI on smoke freeze/eager"),
    "bash scripts/test.sh": Smallest(None, "this test runs inside it (.ci/run; tests/test_workflows.py)"),
    "bash .ci/run": Smallest(None, "CI's entry, which runs bash scripts/test.sh: this test runs inside it"),
    "source .venv/bin/activate": Smallest(None, "what it does (.venv/bin first on PATH) is how every run here runs"),
    "te-verify run --tier smoke --backend eager": Smallest(None, "run.sh's smallest version is this run, narrowed"),
    "te-verify run --tier pr --backend thunder --report-dir reports/thunder": Smallest(
        None, "thunder compiles each case in seconds; the same CLI runs in run.sh's entry"),
    "pytest cases/test_freeze.py --tier pr -n 2 --backend eager": Smallest(
        "pytest cases/test_freeze.py --tier smoke -n 0 --backend eager -p no:cacheprovider", "smoke tier, one process"),
    # README: shards, merge, diff. The shard runs are te-verify runs (tests/test_shards.py runs shards and merges
    # them); merge and diff run on run.sh's report.
    "te-verify run --tier smoke --shard 1/2 --report-dir reports/s1": Smallest(None, "tests/test_shards.py runs shards"),
    "te-verify run --tier smoke --shard 2/2 --report-dir reports/s2": Smallest(None, "tests/test_shards.py runs shards"),
    "te-verify report merge reports/s1 reports/s2 --out reports/smoke": Smallest(
        "te-verify report merge {report} --out {tmp}/merged", "the one report run.sh's entry wrote"),
    "te-verify report diff reports/s1/results.json reports/smoke/results.json": Smallest(
        "te-verify report diff {report}/results.json {tmp}/merged/results.json", "run.sh's report against its merge"),
    # README: certify your own.
    "te-verify run --tier smoke --backend examples.my_compiler:MyCompiler": Smallest(
        "te-verify run --tier smoke --backend examples.my_compiler:MyCompiler -k 'test_freeze and freeze1010' "
        "--workers 0 --report-dir {tmp}/mine", "the worked example on one case: it compiles each"),
    "te-verify run --tier pr --backend te_eager --te-impl tests.minimal_te_build": Smallest(
        None, "tests/test_te_impl_families.py runs the TE lane's pr tier on this build"),
    "te-verify run --tier pr --backend examples.user_wrapper:FlatAllReduceDP": Smallest(
        None, "tests/test_user_wrapper.py runs the example's families in the rank pool"),
    "torchrun --nproc-per-node 2 -m te_verify.distributed --device cpu --wrap examples.user_wrapper:FlatAllReduceDP":
        Smallest(None, "tests/test_user_wrapper.py runs the example under torchrun"),
    # docs/distributed.md
    "pytest cases/test_dist_ddp.py --tier smoke -n 0 --backend ddp": Smallest(
        None, "a rank pool's start and DDP's cases: tests/test_pool.py and the pr tier run them"),
    "torchrun --nproc-per-node 2 -m te_verify.distributed --tier pr --report-dir reports/dist": Smallest(
        None, "tests/test_torchrun.py runs the torchrun entry"),
    "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr node0 --master-port 29500 -m "
    "te_verify.distributed --tier pr --report-dir reports/dist": Smallest(
        None, "two nodes; tests/test_torchrun.py runs it with two launchers on one machine"),
    # docs/expectations.md
    "te-verify expectations update reports/thunder --dir expectations": Smallest(
        "cp -r expectations {tmp}/expectations && te-verify expectations update {report} --dir {tmp}/expectations",
        "run.sh's report, into a copy: the checkout's expectations stay as they are"),
    "te-verify report html reports/thunder/results.json": Smallest(
        "te-verify report html {report}/results.json", "run.sh's report"),
    "te-verify report reports/thunder": Smallest("te-verify report {report}", "run.sh's report, re-rendered"),
    "te-verify run --tier smoke --backend eager --report-dir reports/smoke-eager": Smallest(
        None, "run.sh's smallest version is this run, narrowed"),
    "te-verify report reports/smoke-eager": Smallest("te-verify report {report}", "run.sh's report, re-rendered"),
    "te-verify run --tier smoke --backend eager --resume reports/smoke-eager": Smallest(
        None, "tests/test_streaming.py kills a run and resumes it"),
    # docs/gpu.md: a GPU runner's stack.
    "pip install --no-deps -e .": Smallest(None, "installs into a GPU runner's stack; scripts/bootstrap.sh does CPU's"),
    'pip install "pytest>=8" "pytest-xdist>=3" "hypothesis>=6" "jinja2>=3"': Smallest(
        None, "installs into a GPU runner's stack; scripts/bootstrap.sh does CPU's"),
    "pytest -n 8 cases/ --tier pr --te-impl transformer_engine --device cuda --report-dir reports/gpu": Smallest(
        None, "needs CUDA and real TE"),
    # docs/models.md, docs/waste.md, docs/tiers.md
    "pytest cases/test_lora.py --tier nightly -n 2 --backend eager": Smallest(None, "the nightly tier: minutes"),
    "pytest cases/test_compare_options.py --tier pr --max-rise 0.10": Smallest(
        None, "two compilations per case; the pr tier runs the family"),
    "te-verify run --tier pr --report-dir reports/candidates --pr-candidates": Smallest(None, "every pr candidate"),
    ".venv/bin/python scripts/measure_summation_orders.py --tier nightly": Smallest(
        ".venv/bin/python scripts/measure_summation_orders.py --tier smoke --top 1", "the nightly tier's takes a minute"),
    ".venv/bin/python scripts/measure_costs.py reports/candidates": Smallest(
        ".venv/bin/python scripts/measure_costs.py --help", "run, it rewrites te_verify/data/pr_costs.json"),
    ".venv/bin/python scripts/measure_costs.py --durations reports/main": Smallest(
        ".venv/bin/python scripts/measure_costs.py --help", "run, it rewrites te_verify/data/pr_durations.json"),
    "pytest cases/test_replay.py --tier smoke -n 0 --backend torch_compile --case-order reverse": Smallest(
        None, "tests/test_case_order.py runs cases in both orders"),
    "te-verify run --tier nightly --shard 1/4 --report-dir reports/s1": Smallest(None, "the nightly tier: minutes"),
    "te-verify run --tier nightly": Smallest(None, "the nightly tier: minutes"),
    "te-verify run --tier nightly -k test_te_": Smallest(None, "the TE lane's nightly tier: 25-45 minutes"),
    "te-verify run --tier nightly --workers 1": Smallest(None, "the whole nightly tier on one worker: 1.5 hours"),
    "te-verify run --tier nightly --workers 2 -k test_te_": Smallest(None, "the TE lane's nightly tier: 7 minutes"),
    "te-verify run --tier nightly --workers 1 --te-capability sm100 -k test_te_": Smallest(
        None, "the TE lane's nightly tier at sm100: 14 minutes"),
    "te-verify run --tier pr --workers 2 -k test_te_": Smallest(None, "the TE lane's pr tier with torch_compile_te: "
                                                                       "minutes"),
    "te-verify report merge reports/s1 reports/s2 reports/s3 reports/s4 --out reports/nightly": Smallest(
        None, "the merge runs in the README's entry; tests/test_shards.py merges shards"),
    # docs/te-lane.md, docs/performance.md
    "te-verify run --tier pr --backend te_eager --te-impl te_verify.te.reference": Smallest(
        None, "tests/test_te_impl_families.py runs it"),
    "python scripts/upstream/te_frozen_weight_bias_grad.py --cpu": Smallest(
        None, "boots TE's Python (seconds); the TE lane's BitFit cases hold the same gap"),
    "python scripts/upstream/te_backward_dw_frozen_bias_grad.py --cpu": Smallest(
        None, "boots TE's Python (seconds); the te_delayed and te_contract split-mask cases hold the same gap"),
    ".venv/bin/python scripts/te_own_tests.py --tests /tmp/te-tests/tests/pytorch --out /tmp/te-own --by-cause "
    "test_quantized_tensor.py": Smallest(".venv/bin/python scripts/te_own_tests.py --help",
                                         "run, it needs TE's repository fetched and takes minutes per file"),
    ".venv/bin/python scripts/te_own_tests.py --tests /tmp/te-tests/tests/pytorch --out /tmp/te-own2 --nice 0 "
    "--one-process --by-cause test_mxfp8_2d_quantize.py nvfp4/test_nvfp4_quantize_exact.py": Smallest(
        ".venv/bin/python scripts/te_own_tests.py --help", "run, it needs TE's repository fetched and takes minutes"),
    ".venv/bin/python scripts/te_own_tests.py --tests /tmp/te-tests/tests/pytorch --out /tmp/fops --capability sm100 "
    "--one-process --nice 15 --by-cause test_fusible_ops.py": Smallest(
        None, "needs TE's repository fetched and takes minutes; the te-own entry runs its --help"),
    ".venv/bin/python scripts/te_versions.py 2.14.0 2.20.2": Smallest(
        ".venv/bin/python scripts/te_versions.py --help", "run, it installs TE wheels from the network"),
    # docs/versions.md
    ".venv/bin/python scripts/te_versions.py 2.14.0 2.17.1 2.18.0 2.19.0 2.20.2 --tier smoke --workers 1 --backend "
    "te_eager": Smallest(None, "installs five TE wheels from the network; the 2.14.0 2.20.2 entry runs its --help"),
    ".venv/bin/python scripts/version_axis.py deepspeed 0.19.7 0.19.8 --tier smoke": Smallest(
        ".venv/bin/python scripts/version_axis.py --help", "run, it installs a DeepSpeed release from the network"),
    ".venv/bin/python scripts/version_axis.py deepspeed 0.19.7 0.19.8 --tier pr": Smallest(
        ".venv/bin/python scripts/version_axis.py --help", "run, it installs a DeepSpeed release from the network"),
    ".venv/bin/python scripts/version_axis.py megatron-core 0.16.0 0.16.1 --tier pr": Smallest(
        ".venv/bin/python scripts/version_axis.py --help", "run, it installs a megatron-core release from the network"),
    ".venv/bin/python scripts/version_axis.py lightning-thunder 0.2.5 0.2.6 --tier smoke": Smallest(
        ".venv/bin/python scripts/version_axis.py --help", "run, it installs a thunder release from the network"),
    ".venv/bin/python scripts/te_versions.py 2.14.0 2.20.2 --tier pr": Smallest(
        ".venv/bin/python scripts/te_versions.py --help", "run, it installs TE wheels from the network"),
    "te-verify run --tier pr --passes": Smallest(None, "the main job (minutes); tests/test_capability_passes.py plans "
                                                       "and merges passes"),
    "te-verify run --passes": Smallest(None, "the main job's flag (minutes); tests/test_capability_passes.py plans and "
                                             "merges passes"),
    "te-verify run --tier smoke --workers 1": Smallest(
        "te-verify run --tier smoke --backend eager --workers 0", "the smoke tier on one backend"),
    # README: a user engine written against te_verify.api
    "pytest cases/test_dist_ddp.py --tier pr --backend examples.user_engine:FlatAllReduceSGD": Smallest(
        None, "tests/test_public_api.py runs the engine's cases"),
    ".venv/bin/python scripts/bench_probes.py --no-case eager thunder torch_compile": Smallest(None, "a benchmark"),
    ".venv/bin/python scripts/bench_retention_gc.py": Smallest(
        ".venv/bin/python scripts/bench_retention_gc.py --objects 0", "no kept objects: six settles, about 5 s"),
    ".venv/bin/python scripts/bench_thunder.py": Smallest(None, "a benchmark"),
    ".venv/bin/python scripts/bench_process_state.py": Smallest(
        ".venv/bin/python scripts/bench_process_state.py --repeats 3", "three timed calls per figure (seconds)"),
    "pytest -n 2": Smallest(None, "named as the measurements' setting, not run as a command"),
    # docs/tiers.md
    "bash scripts/proofs.sh": Smallest(None, "the pr-tier proofs (minutes); the test command runs them at smoke"),
    "bash scripts/system_tests.sh": Smallest(None, "the end-to-end tests (about 20 minutes; the cpu workflow's system job)"),
    # docs/te-compile.md: the compile environment (torch 2.15.0) (5.4 GB, minutes to install) and runs in it; the pinned one.
    "bash scripts/bootstrap.sh --compile": Smallest(None, "installs torch 2.15.0 with its CUDA libraries (5.7 GB)"),
    "bash scripts/run_torch_compile_te.sh": Smallest(
        None, "bootstraps .venv-compile first; tests/test_te_compile.py runs the compiled-path tests there"),
    "bash scripts/run_torch_compile_te.sh --tier nightly --backend torch_compile_te --backend torch_compile_te_inductor "
    "--report-dir reports/compile-nightly": Smallest(None, "the nightly tier in .venv-compile: the nightly workflow"),
    "bash scripts/run_torch_compile_te.sh --tier pr --backend torch_compile_te --te-capability sm100 --report-dir "
    "reports/compile-sm100": Smallest(None, "the pr tier in .venv-compile at sm100: minutes"),
    "pytest cases/ --tier pr -n 2 --backend torch_compile_te": Smallest(
        None, "minutes; tests/test_te_compile.py runs one torch_compile_te case through the plugin"),
}


def test_every_command_is_mapped_and_checks_statically(pytestconfig):
    """Each documented command: an entry in SMALLEST (unless a pattern), and no static problem."""
    known = option_table(pytestconfig)
    problems = []
    for page, command in documented():
        if not is_pattern(command) and command not in SMALLEST:
            problems.append(f"{page}: `{command}` has no entry in SMALLEST (its smallest version, or None and why)")
        problems += [f"{page}: `{command}`: {p}" for p in static_problems(command, known)]
    stale = set(SMALLEST) - {command for _, command in documented()}
    problems += [f"SMALLEST[{c!r}]: no page shows this command any more" for c in sorted(stale)]
    assert not problems, "\n".join(problems)


def venv_is_current() -> bool:
    """Whether scripts/bootstrap.sh would leave .venv as it is (its stamp is the hash of the pins it installed)."""
    pins = b"".join((ROOT / f).read_bytes() for f in ("constraints.txt", "pyproject.toml", "scripts/bootstrap.sh"))
    stamp = ROOT / ".venv" / ".te_verify_stamp"
    return stamp.exists() and stamp.read_text().strip() == hashlib.sha256(pins).hexdigest()


def test_the_smallest_version_of_every_command_runs(tmp_path):
    """The runs, in SMALLEST's order (run.sh's entry first: it writes the report the others read). Under the test
    command bootstrap has just run; elsewhere (a worktree whose pins differ from a shared .venv's) run.sh would
    reinstall .venv, which is not this test's to do."""
    if not venv_is_current():
        pytest.skip("scripts/bootstrap.sh would reinstall .venv (its stamp differs from the pins): run scripts/test.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's xdist worker
    env.update(PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    failures = []
    for command, smallest in SMALLEST.items():
        if smallest.command is None:
            continue
        line = smallest.command.format(tmp=tmp_path, report=tmp_path / "report")
        proc = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode != smallest.exit_status:
            failures.append(f"`{command}` as `{line}`: exit {proc.returncode}, expected {smallest.exit_status}\n"
                            f"{(proc.stdout + proc.stderr)[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_every_relative_link_resolves():
    problems = [p for page in map(read_page, PAGES) for p in link_problems(page)]
    assert not problems, "\n".join(problems)


def test_every_repository_path_named_exists():
    """Inline code that names a repository path (`te_verify/run/runner.py`, `cases/`) names one that exists."""
    problems = [p for page in map(read_page, PAGES) for p in path_problems(page)]
    assert not problems, "\n".join(problems)


def test_every_example_parses_and_matches_the_file_it_names():
    problems = [p for page in map(read_page, PAGES) for p in example_problems(page)]
    assert not problems, "\n".join(problems)


# A mistake a page could make -> what the checks must say about it.
PLANTED_COMMANDS = {
    "te-verify run --tier nightlyy": "not a tier",
    "pytest cases/test_nope.py --tier pr": "cases/test_nope.py: no such file",
    "pytest cases/test_freeze.py --tierr pr": "--tierr: no such option",
    "te-verify run --backend examples.nope:Nope": "--backend examples.nope:Nope",
    "te-verify run --te-impl no_such_build": "--te-impl no_such_build",
    "te-verify run --shard 3/2": "--shard 3/2",
    "torchrun --nproc-per-node 2 -m te_verify.distributed --wrap examples.my_compiler:MyCompiler": "--wrap",
    "python scripts/te_versions.py --nope": "--nope: not an option of scripts/te_versions.py",
    "bash scripts/nope.sh": "scripts/nope.sh: no such file",
    "make all": "make: not a program",
}
PLANTED_PAGE = """# Planted

[a missing page](nope.md), [a missing heading](#nowhere), [a heading](#planted), `te_verify/nope.py`.

```python
# examples/my_compiler.py
class MyCompiler:
    name = "not_my_compiler"
```

```toml
checks = [
```
"""


@pytest.mark.parametrize("command, said", PLANTED_COMMANDS.items())
def test_a_planted_mistake_in_a_command_is_named(command, said, pytestconfig):
    problems = static_problems(command, option_table(pytestconfig))
    assert any(said in p for p in problems), problems


def test_planted_mistakes_in_a_page_are_named(tmp_path):
    (tmp_path / "page.md").write_text(PLANTED_PAGE)
    page = read_page(tmp_path / "page.md")
    assert link_problems(page) == ["page.md: link nope.md: no such file",
                                   "page.md: link #nowhere: no such heading in page.md"]
    assert path_problems(page) == ["page.md: `te_verify/nope.py` does not exist"]
    examples = example_problems(page)
    assert len(examples) == 2 and "is not in examples/my_compiler.py" in examples[0] and "does not parse" in examples[1]
