"""megatron_fsdp's SYNC_STEP orders Megatron-FSDP's async collectives on CPU only if every one goes through the module
it confines (megatron_fsdp.param_and_grad_buffer): no other module of the installed package may issue a collective
with async_op / async_ops set, overlap paths included. A static scan of the package's source, with planted sources."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "all_to_all", "all_to_all_single",
               "reduce", "gather", "scatter", "isend", "irecv", "batch_isend_irecv", "_coalescing_manager"}
CONFINED = "param_and_grad_buffer.py"  # the module SYNC_STEP makes synchronous


def async_collectives(source: str, filename: str) -> list[str]:
    """'file:line call' for every torch.distributed collective in `source` that may return before it finishes: an
    async_op / async_ops keyword that is not the constant False, or a point-to-point op (always async)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in COLLECTIVES:
            continue
        receiver = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else "torch.distributed"
        if receiver not in ("torch.distributed", "dist"):
            continue
        flags = [k.value for k in node.keywords if k.arg in ("async_op", "async_ops")]
        if name in ("isend", "irecv", "batch_isend_irecv") or any(
                not (isinstance(v, ast.Constant) and v.value is False) for v in flags):
            found.append(f"{filename}:{node.lineno} {ast.unparse(node.func)}")
    return found


def package_dir() -> Path:
    spec = importlib.util.find_spec("megatron_fsdp")
    if spec is None or spec.origin is None:
        pytest.skip("megatron-fsdp is not installed")
    return Path(spec.origin).parent


def test_every_async_collective_of_megatron_fsdp_is_in_the_module_sync_step_confines():
    # The scan is about the installed release, whatever its version: SYNC_STEP must cover every async collective
    files = sorted(package_dir().glob("*.py"))
    outside = [hit for f in files if f.name != CONFINED for hit in async_collectives(f.read_text(), f.name)]
    inside = async_collectives((package_dir() / CONFINED).read_text(), CONFINED)
    assert not outside, f"async collectives SYNC_STEP does not cover: {outside}"
    assert inside, "the scan found no async collective in the confined module: it would miss one anywhere"


@pytest.mark.parametrize("planted", [
    "torch.distributed.all_reduce(t, async_op=True)",
    "dist.all_gather_into_tensor(out, t, async_op=overlap)",
    "with _coalescing_manager(group, async_ops=True):\n    pass",
    "dist.isend(t, 1)",
])
def test_the_scan_catches_a_planted_async_collective(planted):
    assert async_collectives(planted, "planted.py") == [f"planted.py:1 {planted.split('(')[0].split()[-1]}"]


@pytest.mark.parametrize("clean", [
    "torch.distributed.all_reduce(t)",
    "torch.distributed.broadcast(t, src=0, async_op=False)",
    "self.buffer.all_reduce_gradients(async_op=True)",  # a method of the confined module's buffer, not a collective
])
def test_the_scan_passes_synchronous_collectives(clean):
    assert async_collectives(clean, "clean.py") == []
