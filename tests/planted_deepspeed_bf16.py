"""DeepSpeed ZeRO-1 under its bf16 section with grad_accum_dtype fp32 (DeepSpeed's BF16_Optimizer), with planted
faults (the pool's `wrap=`):

- `zero1_bf16_last_microbatch_unreduced`: deepspeedai/DeepSpeed#7985 as 0.18.3-0.18.9 ran it: the engine's
  backward epilogue all-reduces the fp32 accumulation buffer before BF16_Optimizer adds the boundary microbatch's
  bf16 gradients to it, so the last microbatch's gradient stays rank-local (0.19.8 runs the epilogue first,
  engine._backward_epilogue). The order is planted on the engine instance, never on DeepSpeed's class (the rank
  process serves later cases).
- `zero1_bf16_reduce_in_bf16`: a config that leaves communication_data_type unset where the policy says fp32
  (DeepSpeed then reduces the fp32 buffer in bf16).
The clean twin is the engine as the spec configures it (`zero1_bf16_as_specified`)."""
from __future__ import annotations

import dataclasses
import types

from te_verify.distributed.engines.deepspeed_zero import ENGINE_ZERO1
from te_verify.distributed.types import Wrapped


def _reduce_before_accumulating(self) -> None:
    """DeepSpeedEngine._backward_epilogue's body before #7985's fix: all-reduce, then accumulate."""
    if self.enable_backward_allreduce and not self.inside_no_sync_ctxt:
        self.allreduce_gradients()
    self.optimizer.backward_epilogue()
    self.optimizer.exit_backward()


def zero1_bf16_last_microbatch_unreduced(model, spec) -> Wrapped:
    wrapped = ENGINE_ZERO1.wrap(model, spec)
    engine = wrapped.keep[0]
    engine._backward_epilogue = types.MethodType(_reduce_before_accumulating, engine)
    return wrapped


def zero1_bf16_reduce_in_bf16(model, spec) -> Wrapped:
    return ENGINE_ZERO1.wrap(model, spec.replace(dist=dataclasses.replace(spec.dist, reduce_dtype="")))


def zero1_bf16_as_specified(model, spec) -> Wrapped:
    return ENGINE_ZERO1.wrap(model, spec)
