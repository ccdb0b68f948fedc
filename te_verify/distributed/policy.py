"""A case's mixed-precision policy (DistConfig.param_dtype / reduce_dtype) as torch dtypes: what the wrappers and
engines configure from, apart from te_verify.distributed.precision (its reference and bound), which reads the engines."""
from __future__ import annotations

import torch

from te_verify.spec import CaseSpec

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def has_policy(spec: CaseSpec) -> bool:
    return spec.dist is not None and bool(spec.dist.param_dtype or spec.dist.reduce_dtype)


def policy_dtypes(spec: CaseSpec) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(param dtype, reduce dtype) as torch dtypes; None where the policy leaves the wrapper's default."""
    return (TORCH_DTYPES.get(spec.dist.param_dtype), TORCH_DTYPES.get(spec.dist.reduce_dtype))
