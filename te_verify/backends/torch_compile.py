"""torch.compile with a chosen dynamo backend: aot_eager (AOTAutograd's partitioning, cheap) or inductor."""
from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from te_verify import device as run_device
from te_verify.spec import CaseSpec


class TorchCompileBackend:
    def __init__(self, dynamo_backend: str = "aot_eager") -> None:
        # The torch.compile backend string; "aot_eager" keeps AOTAutograd's forward/backward split without
        # inductor's ~16 s per-case codegen on these CPUs.
        self.dynamo_backend = dynamo_backend
        self.name = "torch_compile" if dynamo_backend == "aot_eager" else f"torch_compile_{dynamo_backend}"

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
        counters.clear()  # reset() keeps them; compilations() reads unique_graphs for this case alone
        return torch.compile(model, backend=self.dynamo_backend, fullgraph=True)
