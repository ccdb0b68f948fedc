"""torch.compile with a chosen dynamo backend: aot_eager (AOTAutograd's partitioning, cheap) or inductor; static
shapes unless the backend is the explicit dynamic one.

What one case's compilation could leave for the next is cut here: dynamo's caches and automatic-dynamic state
(`torch._dynamo.reset()`), and inductor's FX-graph and AOTAutograd caches, which `reset()` does not clear (they
live on disk): a cache hit loads a backward compiled ahead of time with donated buffers, so whether
`backward(retain_graph=True)` raises depended on which cases ran before, in this process or an earlier one.
Shapes are static (`dynamic=False`), so automatic dynamic shapes never turn on by the order cases arrive in;
`torch_compile_dynamic` compiles with `dynamic=True` on purpose.
"""
from __future__ import annotations

import torch
import torch._functorch.config
import torch._inductor.config
from torch._dynamo.utils import counters

from te_verify import device as run_device
from te_verify.spec import CaseSpec


def no_compile_caches() -> None:
    """Compile every case from scratch: no inductor FX-graph or AOTAutograd cache (in memory or on disk)."""
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.fx_graph_remote_cache = False
    torch._functorch.config.enable_autograd_cache = False


class TorchCompileBackend:
    def __init__(self, dynamo_backend: str = "aot_eager", dynamic: bool = False) -> None:
        # The torch.compile backend string; "aot_eager" keeps AOTAutograd's forward/backward split without
        # inductor's ~16 s per-case codegen on these CPUs.
        self.dynamo_backend = dynamo_backend
        # torch.compile(dynamic=...): False pins static shapes; True is the torch_compile_dynamic backend.
        self.dynamic = dynamic
        name = "torch_compile" if dynamo_backend == "aot_eager" else f"torch_compile_{dynamo_backend}"
        self.name = f"{name}_dynamic" if dynamic else name

    def available(self) -> tuple[bool, str]:
        if self.dynamo_backend not in torch._dynamo.list_backends(exclude_tags=()):
            return False, f"torch {torch.__version__} has no dynamo backend {self.dynamo_backend!r}"
        if self.dynamo_backend == "inductor" and run_device.active().type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                return False, "inductor compiles CUDA kernels with triton, which is not installed"
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        torch._dynamo.reset()  # no guard/cache carry-over between cases: each case compiles once, fresh
        no_compile_caches()
        counters.clear()  # reset() keeps them; compilations() reads unique_graphs for this case alone
        return torch.compile(model, backend=self.dynamo_backend, fullgraph=True, dynamic=self.dynamic)
