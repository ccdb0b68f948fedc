"""torch.compile with a chosen dynamo backend: aot_eager (AOTAutograd's partitioning, cheap) or inductor; static
shapes unless the backend is the explicit dynamic one.

Shapes are static (`dynamic=False`), so automatic dynamic shapes never turn on by the order cases arrive in (with
torch's default, dynamic=None, a second input shape through the same code recompiles with dynamic shapes, whose
backward AOTAutograd compiles ahead of time with donated buffers: a later backward(retain_graph=True) raises);
`torch_compile_dynamic` compiles with `dynamic=True` on purpose. Every case compiles from scratch: dynamo's state
and the compile caches are cut before each case builds its model (te_verify.run.isolation).
"""
from __future__ import annotations

import torch
import torch._dynamo

from te_verify import device as run_device
from te_verify.spec import CaseSpec


class TorchCompileBackend:
    def __init__(self, dynamo_backend: str = "aot_eager", dynamic: bool = False) -> None:
        # The torch.compile backend string; "aot_eager" keeps AOTAutograd's forward/backward split without
        # inductor's ~16 s per-case codegen on these CPUs.
        self.dynamo_backend = dynamo_backend
        # torch.compile(dynamic=...): False pins static shapes; True is the torch_compile_dynamic backend.
        self.dynamic = dynamic
        name = "torch_compile" if dynamo_backend == "aot_eager" else f"torch_compile_{dynamo_backend}"
        self.name = f"{name}_dynamic" if dynamic else name

    @property
    def allocates_outside_dispatch(self) -> bool:
        """Inductor's compiled code allocates its buffers in C++ (empty_strided_cpu), which no dispatched op shows:
        on CPU the peak tracker cannot see them (probes.memory; on CUDA the allocator does)."""
        return self.dynamo_backend == "inductor"

    def available(self) -> tuple[bool, str]:
        if self.dynamo_backend not in torch._dynamo.list_backends(exclude_tags=()):
            return False, f"torch {torch.__version__} has no dynamo backend {self.dynamo_backend!r}"
        if self.dynamo_backend == "inductor" and run_device.active().type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                return False, "inductor compiles CUDA kernels with triton, which is not installed"
        return True, ""

    def prepare(self, model: torch.nn.Module, spec: CaseSpec):
        return torch.compile(model, backend=self.dynamo_backend, fullgraph=True, dynamic=self.dynamic)
