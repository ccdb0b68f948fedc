"""The main job's passes (te_verify.passes): every TE case at the capability it needs on an emulated device,
torch_compile_te in the environment where TE's compiled path runs, one merged report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import report_fixtures
from pytest_many import run_many

from te_verify.matrix.capability import DEFAULT, capabilities
from te_verify.matrix.stacks import SQUARE4
from te_verify.report.merge import MergeError, merge
from te_verify.passes import COMPILE_BACKENDS, Pass, command, exit_status, plan
from te_verify.spec import CaseSpec, TEConfig

FROZEN = (True, False, True, False)


def te_case(**te) -> CaseSpec:
    return CaseSpec("te_fp8", SQUARE4, FROZEN, FROZEN, True, (32,), te=TEConfig(**te))


@pytest.mark.parametrize("te, want", [
    ({}, (DEFAULT,)),
    ({"recipe": "delayed"}, (DEFAULT,)),
    ({"recipe": "mxfp8"}, ("sm100",)),
    ({"recipe": "nvfp4_rn"}, ("sm100",)),
    ({"recipe": "custom", "qfactory": "high_precision_fwd_mxfp8_bwd_factory"}, ("sm100",)),
    # TE's FP8 copies differ at sm90 (transposed copies) and sm100 (non-TN GEMMs): a grouped module runs at both.
    ({"recipe": "delayed", "module": "grouped_linear"}, (DEFAULT, "sm100")),
])
def test_each_te_case_runs_where_te_serves_it(te, want):
    assert capabilities(te_case(**te)) == want


def test_the_compile_backends_move_only_where_this_torch_lacks_the_api_and_the_environment_exists():
    backends = ["eager", "te_eager", "torch_compile_te"]
    moved = plan(backends, here_lacks_compile_api=True, compile_env="/env/bin/python")
    assert [(p.name, p.python, p.backends) for p in moved] == [
        ("sm90", sys.executable, ("eager", "te_eager")), ("sm100", sys.executable, ("eager", "te_eager")),
        ("compile-sm90", "/env/bin/python", ("torch_compile_te",)),
        ("compile-sm100", "/env/bin/python", ("torch_compile_te",))]
    for lacks, env in ((True, None), (False, "/env/bin/python")):  # no environment, or this torch has the API
        assert [p.backends for p in plan(backends, lacks, env)] == [tuple(backends)] * 2
    assert [p.name for p in plan(list(COMPILE_BACKENDS), True, "/env/bin/python")] == ["compile-sm90", "compile-sm100"]


def test_a_pass_names_its_capability_backends_and_folder():
    cmd = command(Pass("sm100", "/py", "sm100", ("te_eager",)), ["--tier", "pr", "--shard", "1/2"], Path("/r/sm100"))
    assert cmd == ["/py", "-m", "te_verify.cli", "run", "--tier", "pr", "--shard", "1/2", "--case-order", "cost",
                   "--report-dir", "/r/sm100", "--backend", "te_eager", "--te-capability", "sm100", "--capability-cases",
                   "--pass-name", "sm100"]
    # the run's own order wins over the main job's longest-first one
    assert "cost" not in command(Pass("sm90", "/py", "sm90", ()), ["--case-order", "reverse"], Path("/r"))


@pytest.mark.parametrize("codes, want", [([0, 0], 0), ([0, 1], 1), ([5, 0], 0), ([5, 5], 5), ([1, 5], 1)])
def test_the_run_fails_when_any_pass_fails_and_is_empty_only_when_every_pass_is(codes, want):
    assert exit_status(codes) == want


@pytest.mark.system
def test_capability_passes_split_the_te_lane_and_keep_the_other_lanes_in_the_default_pass():
    """The sm90 pass holds the freeze family, the drawn specs' tests and the FP8 cases TE serves at sm90; the sm100
    pass holds MXFP8 (named -sm100) and no torch-lane case; a plain run at sm90 keeps today's ids."""
    files = ["cases/test_freeze.py", "cases/test_te_fp8.py", "cases/test_generated.py", "--tier", "pr", "--collect-only",
             "--backend", "eager",
             "--backend", "te_eager"]
    results, proc = run_many([[*files, "--te-capability", cap, "--capability-cases"] for cap in ("sm90", "sm100")]
                             + [files])
    sm90, sm100, plain = (set(r["ids"]) for r in results)
    assert sm90 and sm100, proc.stdout[-2000:]
    assert any("test_freeze" in i for i in sm90) and not any("test_freeze" in i for i in sm100)
    # a test drawing its own specs runs in the default pass only (the merge refuses a row twice)
    assert any("test_generated[" in i for i in sm90) and not any("test_generated" in i for i in sm100)
    assert any("fp8mxfp8-sm100]" in i for i in sm100) and not any("mxfp8" in i for i in sm90)
    assert all(i.endswith("-sm100]") for i in sm100)
    assert sm90 <= plain and any("mxfp8" in i for i in plain)  # a single-capability run selects as before


def _report(folder: Path, name: str, shard: str, spec: CaseSpec, suffix: str = "") -> Path:
    """A pass's report folder: one te_eager row of `spec`, its nodeid ending in `suffix` (-sm100 at sm100)."""
    folder.mkdir(parents=True)
    head = {**report_fixtures.header(name), "shard": shard, "pass": name, "te_capability": name,
            "te_compile": f"torch of {name}"}
    one = report_fixtures.row(spec, "te_eager", "passed")
    one["nodeid"] = one["nodeid"][:-1] + suffix + "]"
    (folder / "results.json").write_text(json.dumps({"schema_version": 1, "header": head, "rows": [one]}))
    return folder


def test_a_shard_merges_once_per_pass_and_the_header_keeps_each_pass(tmp_path):
    case = te_case(recipe="delayed", module="grouped_linear")
    sm90 = _report(tmp_path / "a", "sm90", "1/2", case)
    sm100 = _report(tmp_path / "b", "sm100", "1/2", case, "-sm100")
    merge([sm90, sm100], tmp_path / "out")
    header = json.loads((tmp_path / "out" / "results.json").read_text())["header"]
    assert header["passes"] == ["sm100", "sm90"] and "pass sm90: torch of sm90" in header["te_compile"]
    again = _report(tmp_path / "c", "sm90", "1/2", te_case())
    with pytest.raises(MergeError, match="shard 1/2 of pass sm90 is in both"):
        merge([sm90, again], tmp_path / "out2")


def test_a_release_outside_the_measured_range_is_a_header_warning_not_a_refusal():
    from te_verify.compat.versions import outside

    assert outside("deepspeed", "0.19.8") is None and outside("torch", "2.15.0+cu132") is None
    assert outside("deepspeed", "0.18.9") == ("deepspeed 0.18.9 is outside the measured 0.19.7 to 0.19.8: runs anyway; "
                                              "docs/versions.md")
    assert outside("torch", "2.16.0") and outside("numpy", "9.0") is None  # untracked: no line
