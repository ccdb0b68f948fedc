"""The torchrun entry across two nodes (two torchrun launchers on this machine, gloo on the CPU, as docs/distributed.md's
two-node command): rank 0 alone writes the report; a case failing on several ranks names each of them. On one
node: a planted failing wrapper makes it exit non-zero; expectations apply as in the plugin."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from te_verify.distributed.__main__ import row, skipped_row
from te_verify.distributed.pool.pool import PoolResult
from te_verify.matrix.dist import ddp_specs
from te_verify.report.stream import STREAM, read_stream

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "planted_skipping_ddp"  # planted_wrappers.PlantedSkippingDDP's name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(node_rank: int, port: int, report: Path) -> subprocess.Popen:
    """One node's torchrun: docs/distributed.md's two-node command with this machine as the master."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "te_verify.distributed", "--tier", "smoke", "--family", "dist_ddp", "--device", "cpu",
            "--report-dir", str(report)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(report.parent)}  # torchrun's torchelastic_* log dirs
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(nodes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each node's output once all exited; past `timeout` every node is killed and the test fails with what each
    one printed (a rendezvous that never completes shows on which side)."""
    deadline = time.monotonic() + timeout
    try:
        return [node.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.kill()
        outs = [node.communicate()[0] for node in nodes]
        pytest.fail(f"the two torchrun nodes did not finish in {timeout:.0f} s:\n" + "\n".join(
            f"--- node {k} ---\n{out[-2000:]}" for k, out in enumerate(outs)))


@pytest.mark.system
def test_two_node_torchrun_writes_one_report_from_rank_0(tmp_path):
    port = free_port()
    nodes = [launch(rank, port, tmp_path / f"node{rank}") for rank in (0, 1)]
    for node, out in zip(nodes, finish(nodes, timeout=300)):
        assert node.returncode == 0, out[-3000:]
    assert not (tmp_path / "node1").exists()  # only global rank 0 (on node 0) writes
    results = json.loads((tmp_path / "node0" / "results.json").read_text())
    assert len(results["header"]["devices"]) == 2 and {d.split("/")[1] for d in results["header"]["devices"]} == {"cpu"}
    ids = [r["case_id"] for r in results["rows"]]
    assert sorted(ids) == sorted(s.id for s in ddp_specs("smoke")) and len(set(ids)) == len(ids)
    assert {r["outcome"] for r in results["rows"]} == {"passed"}
    stream = read_stream(tmp_path / "node0" / STREAM)  # rank 0 streamed the same rows as they finished
    assert sorted(r["nodeid"] for r in stream["rows"]) == sorted(stream["selection"]) == sorted(
        r["nodeid"] for r in results["rows"])


def test_a_case_failing_on_several_ranks_names_each_rank():
    spec = ddp_specs("smoke")[0]
    errors = {0: "Traceback (most recent call last):\nRuntimeError: rank zero broke",
              1: "Traceback (most recent call last):\nValueError: rank one broke"}
    failed = row(spec, PoolResult([None, None], errors, 0.0, 0.1), 0.1)
    assert failed["outcome"] == "failed"
    assert "rank 0: did not complete" in failed["reason"] and "RuntimeError: rank zero broke" in failed["reason"]
    assert "rank 1: did not complete" in failed["reason"] and "ValueError: rank one broke" in failed["reason"]


def test_a_case_of_another_world_size_is_a_skipped_row_with_the_reason():
    skipped = skipped_row(ddp_specs("smoke")[0], 4)
    assert skipped["outcome"] == "skipped" and skipped["reason"] == "world size 2: this torchrun world has 4 ranks"


def run_one_node(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The entry on one node, two CPU ranks, the smoke tier's DDP family; its rows."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-port", str(free_port()), "-m", "te_verify.distributed", "--tier", "smoke", "--family", "dist_ddp",
            "--device", "cpu", "--report-dir", str(tmp_path / "report"), *args]
    tmp_path.mkdir(parents=True, exist_ok=True)  # a TMPDIR that does not exist sends tempfile back to /tmp
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path),  # torchrun's torchelastic_* log dirs
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    results = tmp_path / "report" / "results.json"
    return proc, json.loads(results.read_text())["rows"] if results.exists() else []


@pytest.mark.system
def test_a_planted_failing_case_exits_non_zero(tmp_path):
    proc, rows = run_one_node(tmp_path, "--wrap", "planted_wrappers:PlantedSkippingDDP")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert rows and {r["outcome"] for r in rows} == {"failed"} and {r["backend"] for r in rows} == {PLANTED}
    assert all("grad of 0.weight" in r["reason"] for r in rows)


@pytest.mark.system
def test_expectations_apply_as_in_the_plugin(tmp_path):
    """The same planted failure recorded as a known gap of its checks exits 0 (xfailed); recorded for one of its two
    failing checks it fails naming the other; a gap recorded for a passing case fails as an unexpected pass. (Another
    failure text than the recorded one is judged by the same code: tests/test_known_gaps.py.)"""
    case = ddp_specs("smoke")[0].id.removesuffix("ddp.ws2")  # the prefix both wrappers' ids share
    folder = tmp_path / "expectations"
    folder.mkdir()
    entry = f'[[xfail]]\nprefix = "{case}"\nreason = "planted"\nlink = "https://example.org/planted"\n'
    both = 'checks = ["dist_grad_parity", "gradient_volume"]\n'
    (folder / f"{PLANTED}.toml").write_text(entry + both + 'failure = "grad of 0.weight"\n')
    planted = ("--wrap", "planted_wrappers:PlantedSkippingDDP", "--expectations", str(folder))
    proc, rows = run_one_node(tmp_path / "known", *planted)
    assert proc.returncode == 0 and [r["outcome"] for r in rows] == ["xfailed"], proc.stdout[-3000:]
    assert "grad of 0.weight" in rows[0]["observed"] and rows[0]["checks"]["gradient_volume"] == "known gap"
    (folder / f"{PLANTED}.toml").write_text(entry + 'checks = ["dist_grad_parity"]\n')
    proc, rows = run_one_node(tmp_path / "beside", *planted)
    assert proc.returncode == 1 and rows[0]["outcome"] == "failed"
    assert "FAILED BESIDE A KNOWN GAP: check 'gradient_volume' failed" in rows[0]["reason"]
    (folder / "ddp.toml").write_text(entry + both)
    proc, rows = run_one_node(tmp_path / "clean", "--expectations", str(folder))
    rows = [r for r in rows if r["case_id"].startswith(case)]
    assert proc.returncode == 1 and rows[0]["outcome"] == "xpassed" and "UNEXPECTED PASS" in rows[0]["reason"]


@pytest.mark.system
def test_bad_wrap_or_expectations_is_a_one_line_error(tmp_path):
    proc, _ = run_one_node(tmp_path, "--wrap", "no_such_module:wrap")
    assert proc.returncode != 0 and "--wrap 'no_such_module:wrap': cannot load it" in proc.stderr
    assert "Traceback" not in proc.stderr.split("--wrap")[0][-200:]


@pytest.mark.system
def test_a_training_engine_with_te_runs_under_torchrun_and_the_header_lists_its_steps(tmp_path):
    proc, rows = run_one_node(tmp_path, "--family", "dist_te_megatron")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    engine_rows = [r for r in rows if r["backend"] == "megatron_ddp"]
    assert engine_rows and all(r["outcome"] == "passed" for r in engine_rows), engine_rows
    assert "params_after_steps" in engine_rows[0]["checks"]
    header = json.loads((tmp_path / "report" / "results.json").read_text())["header"]
    assert any(step.startswith("megatron-core-cpu-device") for step in header["compat"]), header["compat"]
    assert header["te_impl"]["name"] != "-"  # TE's Linear ran: the header says which implementation


@pytest.mark.system
def test_a_hanging_case_ends_the_job_with_its_row_and_the_report_marked_incomplete(tmp_path):
    """Rank 1 never returns from forward, rank 0 waits in a collective: both watchdogs fire at --case-timeout, rank 0
    writes the case's row with its stack and the report naming the cases that never ran; the job exits 1 in time."""
    began = time.monotonic()
    proc, rows = run_one_node(tmp_path, "--wrap", "planted_wrappers:PlantedHangingDDP", "--case-timeout", "5",
                              "--tier", "pr")  # several cases: the ones after the hung one never run
    took = time.monotonic() - began
    assert proc.returncode != 0 and took < 5 + 60, (took, proc.stderr[-3000:])
    assert [r["outcome"] for r in rows] == ["failed"] and rows[0]["reason"].startswith("rank 0: timed out after 5 s")
    assert "(running the case)" in rows[0]["reason"]  # the stack where rank 0 waited
    header = json.loads((tmp_path / "report" / "results.json").read_text())["header"]
    assert header["incomplete"]["ran"] == 1 and header["incomplete"]["selected"] > 1
    assert "timeout (5 s)" in header["incomplete"]["why"] and "incomplete: 1 of" in proc.stderr


@pytest.mark.system
def test_a_report_folder_in_use_is_refused_on_every_rank_in_one_line(tmp_path):
    from te_verify.report.lock import acquire

    held = acquire(tmp_path / "report", "the-other-run")
    try:
        proc, rows = run_one_node(tmp_path)
    finally:
        held.release()
    assert proc.returncode != 0 and not rows  # every rank exits 2; torchrun itself exits 1
    refusals = [line for line in proc.stderr.splitlines() if "is in use by run the-other-run" in line]
    assert len(refusals) == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr.split("is in use")[0]  # (torchrun's own report of the exits follows)
