"""A distributed wrapper's gradient accumulation (CaseSpec.microbatches; issue 34, item 5): the rank's shard chunked
into microbatches (as an engine's are: training.chunked), their passes in the spec's order, every pass of microbatches
1..n-1 under the wrapper's no-sync context (Wrapped.no_sync) and microbatch n's outside it, as the wrappers document
accumulation. Interleaved, that is their documented loop; forwards first, the same split of every pass (forwards
1..n-1 quiet, forward n not; backwards 1..n-1 quiet, backward n not), so the gradients of every microbatch are
reduced once, after the last backward. The collective counter sees every microbatch, the probes the first (a rank's
oracle is one microbatch's: verify.local_spec), the timeline the last microbatch's backward from its own forward's
layer boundaries: under no-sync a wrapper may keep parameters gathered for the next microbatch (fairscale's
_finalize_parameters does, on purpose), so reshard timing is the synchronised pass's."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from te_verify.distributed.rank.observe import Timeline, keep_boundaries
from te_verify.distributed.types import Wrapped, WrapperError
from te_verify.spec import CaseSpec
from te_verify.training import SetPhase, chunked


def accumulate(spec: CaseSpec, wrapped: Wrapped, x: torch.Tensor, cotangent: torch.Tensor, phase: SetPhase,
               timeline: Timeline | None, observe: bool) -> torch.Tensor:
    """An iteration's microbatches (the timeline watched where `observe`: the measured iteration); the rank's output
    (every microbatch's, in order)."""
    if wrapped.no_sync is None:
        raise WrapperError(f"microbatches={spec.microbatches}: {spec.dist.wrapper} declares no no-sync context "
                           f"(Wrapped.no_sync) to accumulate in")
    batches = chunked(x, cotangent, spec.microbatches)
    last = len(batches) - 1
    quiet = lambda k: wrapped.no_sync() if k < last else contextlib.nullcontext()
    kept: dict[int, torch.Tensor] = {}
    handles = keep_boundaries(wrapped.layers, kept) if observe else []
    seen: list[dict[int, torch.Tensor]] = []
    try:
        def forward(k: int) -> torch.Tensor:
            with quiet(k):
                phase("forward", k)
                out = wrapped.module(batches[k][0])
            seen.append(dict(kept))
            return out

        def backward(k: int, out: torch.Tensor) -> None:
            if observe and k == last:  # after every forward: these hooks run after the wrapper's own
                timeline.watch_boundaries(seen[k])
                timeline.mark("backward_start", len(wrapped.layers))
            with quiet(k):
                phase("backward", k)
                out.backward(batches[k][1])

        return torch.cat(_in_order(spec.accumulation, len(batches), forward, backward))
    finally:
        for handle in handles:
            handle.remove()


def _in_order(order: str, n: int, forward, backward) -> list[torch.Tensor]:
    """Run microbatches 0..n-1: each forward then its backward, or (forwards_first) every forward, then the
    backwards in the same order; their outputs, detached."""
    if order == "forwards_first":
        outs = [forward(k) for k in range(n)]
        for k, out in enumerate(outs):
            backward(k, out)
    else:
        outs = []
        for k in range(n):
            outs.append(forward(k))
            backward(k, outs[-1])
    return [out.detach() for out in outs]
