"""Peak memory over the whole run (forward + every backward pass) and over backward passes alone.

On every device: the shared Watcher's tracker of live storages allocated during the run (a weakref callback per
storage untracks it when freed; bytes are storage bytes, no allocator rounding), the units the oracle's bound is in.
On a CUDA run device the allocator's figure is added beside it (`peak_allocator_bytes`: `max_memory_allocated` after
`reset_peak_memory_stats`, minus what was allocated at entry), not judged: it rounds every block up to 512 B and
counts the kernels' own workspaces (a multi-block reduction's staging buffer), which no schedule of the case can
avoid (the first GPU run judged it: eager itself was 1.5-2.6x over the bound, docs/gpu.md). Memory that existed
before the run (parameters, the input, the output cotangent) is not counted, so the figures are what the run
itself added. `torch.distributed._tools.mem_tracker.MemTracker` is not used: in torch 2.13
it raises on frozen parameters (unconditional `register_hook`, mem_tracker.py:603).

`peak_backward_bytes` is the highest live total reached while any backward pass ran (saved activations still
alive at its start included).
"""
from __future__ import annotations

from typing import Any

import torch

from te_verify import device as run_device
from te_verify.probes import dispatch
from te_verify.probes.watcher import Watcher


class PeakMemoryProbe:
    """Peak live bytes over the run and over backward passes."""

    name = "memory"

    def __init__(self) -> None:
        self.device = run_device.active()
        self.source = "storage_tracker"
        self.allocator = self.device.type == "cuda"  # the CUDA allocator's peak is read too (a figure)
        self.peak_allocator_bytes = 0
        self.peak_bytes = 0
        self.peak_backward_bytes = 0
        self._in_backward = False
        self._baseline = 0
        self._watcher: Watcher | None = None
        self._live_at_entry = 0  # live bytes the shared watcher tracked already (an earlier iteration's, kept)

    def again(self) -> "PeakMemoryProbe":
        """A fresh probe for a later iteration: its peak counts what that iteration adds."""
        return PeakMemoryProbe()

    def __enter__(self) -> "PeakMemoryProbe":
        self.peak_bytes = self.peak_backward_bytes = 0
        self._in_backward = False
        self.peak_allocator_bytes = 0
        if self.allocator:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
        self._watcher = dispatch.subscribe(self)
        self._live_at_entry = self._watcher.current_bytes
        self._watcher.reset_window()
        return self

    def _reset_window(self) -> None:
        self._watcher.reset_window()
        if self.allocator:
            torch.cuda.reset_peak_memory_stats(self.device)

    def _close_window(self) -> None:
        peak = self._watcher.window_peak_bytes - self._live_at_entry
        if self.allocator:
            torch.cuda.synchronize(self.device)
            allocated = torch.cuda.max_memory_allocated(self.device) - self._baseline
            self.peak_allocator_bytes = max(self.peak_allocator_bytes, allocated)
        self.peak_bytes = max(self.peak_bytes, peak)
        if self._in_backward:
            self.peak_backward_bytes = max(self.peak_backward_bytes, peak)

    def phase(self, name: str, index: int = 0) -> None:
        dispatch.set_phase(name)
        self._close_window()
        self._reset_window()
        self._in_backward = name == "backward"

    def __exit__(self, *exc: object) -> None:
        self._close_window()
        dispatch.unsubscribe(self)

    def figures(self) -> dict[str, Any]:
        allocator = {"peak_allocator_bytes": self.peak_allocator_bytes} if self.allocator else {}
        return {"peak_bytes": self.peak_bytes, "peak_backward_bytes": self.peak_backward_bytes,
                "peak_source": self.source, **allocator}

    def observations(self) -> dict[str, Any]:
        return {}
