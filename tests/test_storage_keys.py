"""Storage keys never alias (probes.storage_keys): a buffer no dispatched op allocated (inductor's, allocated in C++)
that takes the address of a dead one gets a key of its own, however it is first keyed, so GEMM attribution never hangs
on where the allocator put a buffer (te_verify issue 26: a te_lora case under torch_compile_te_inductor lost
blocks.0.attn.v.lora_a's wgrad in some runs and in some case orders). Buffers here are numpy-backed: each
torch.from_numpy of one array is a new storage object at the same address, as a reused buffer is, every run."""
from __future__ import annotations

import numpy as np
import torch

from te_verify.probes import dispatch
from test_probes_flops import probe_one_step

ROWS, WIDTH, RANK, SITES = 8, 32, 4, 3


def test_a_gemm_output_buffer_at_a_reused_address_keeps_its_own_key():
    memory = np.zeros((ROWS, RANK), dtype=np.float32)
    a, b = torch.randn(ROWS, WIDTH), torch.randn(WIDTH, RANK)
    probe = object()
    watcher = dispatch.subscribe(probe)
    try:
        first = torch.from_numpy(memory)
        torch.mm(a, b, out=first)  # keyed first as a GEMM's output, never as an operand
        first_key = watcher.key(first)
        del first
        second = torch.from_numpy(memory)  # a new buffer where the dead one was
        torch.mm(second.t(), a)
        assert second.untyped_storage().data_ptr() == memory.ctypes.data
        assert watcher.key(second) != first_key
    finally:
        dispatch.unsubscribe(probe)


class _SharedInputAdapters(torch.autograd.Function):
    """Three LoRA adapters (A: WIDTH -> RANK, trainable; B: RANK -> WIDTH, frozen) reading one input, the output
    gradient of each A written by B's dgrad into one reused buffer, as inductor's backward of a LoRA attention block
    does for v, k and q: the A sites share their input and weight shape, so only the gradient's buffer tells their
    wgrads apart."""

    @staticmethod
    def forward(ctx, x, memory, *weights):
        a_weights, b_weights = weights[:SITES], weights[SITES:]
        ctx.save_for_backward(x, *weights)
        ctx.memory = memory
        return sum(torch.mm(torch.mm(x, a.t()), b.t()) for a, b in zip(a_weights, b_weights))

    @staticmethod
    def backward(ctx, g):
        x, *weights = ctx.saved_tensors
        a_weights, b_weights = weights[:SITES], weights[SITES:]
        wgrads = []
        for a, b in zip(a_weights, b_weights):
            buffer = torch.from_numpy(ctx.memory)  # a new storage where the last site's dead one was
            torch.mm(g, b, out=buffer)  # B's dgrad: A's output gradient
            wgrads.append(torch.mm(buffer.t(), x))
            torch.mm(buffer, a)  # A's dgrad
            del buffer
        return None, None, *wgrads, *(None,) * SITES


class _Adapters(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lora_a = torch.nn.ModuleList(torch.nn.Linear(WIDTH, RANK, bias=False) for _ in range(SITES))
        self.lora_b = torch.nn.ModuleList(torch.nn.Linear(RANK, WIDTH, bias=False) for _ in range(SITES))
        self.lora_b.requires_grad_(False)
        self.memory = np.zeros((ROWS, RANK), dtype=np.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = [m.weight for m in (*self.lora_a, *self.lora_b)]
        return _SharedInputAdapters.apply(x, self.memory, *weights)


def test_wgrads_whose_gradients_share_a_reused_buffer_each_name_their_site():
    probe = probe_one_step(_Adapters(), torch.randn(ROWS, WIDTH))
    wgrads = [e.layer for e in probe.events if e.role == "wgrad"]
    assert wgrads == list(range(SITES))  # layers 0..2 are lora_a.0..2 (module order)
