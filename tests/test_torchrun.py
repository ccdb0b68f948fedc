"""The torchrun entry across two nodes (two torchrun launchers on this machine, gloo on the CPU, as the README's
two-node command): rank 0 alone writes the report; a case failing on several ranks names each of them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from te_verify.distributed.__main__ import row, skipped_row
from te_verify.distributed.pool import PoolResult
from te_verify.matrix_dist import ddp_specs

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(node_rank: int, port: int, report: Path) -> subprocess.Popen:
    """One node's torchrun: the README's two-node command with this machine as the master."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "te_verify.distributed", "--tier", "smoke", "--family", "dist_ddp", "--device", "cpu",
            "--report-dir", str(report)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_node_torchrun_writes_one_report_from_rank_0(tmp_path):
    port = free_port()
    nodes = [launch(rank, port, tmp_path / f"node{rank}") for rank in (0, 1)]
    for node in nodes:
        out, _ = node.communicate(timeout=300)
        assert node.returncode == 0, out[-3000:]
    assert not (tmp_path / "node1").exists()  # only global rank 0 (on node 0) writes
    results = json.loads((tmp_path / "node0" / "results.json").read_text())
    assert len(results["header"]["devices"]) == 2 and {d.split("/")[1] for d in results["header"]["devices"]} == {"cpu"}
    ids = [r["case_id"] for r in results["rows"]]
    assert sorted(ids) == sorted(s.id for s in ddp_specs("smoke")) and len(set(ids)) == len(ids)
    assert {r["outcome"] for r in results["rows"]} == {"passed"}


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
