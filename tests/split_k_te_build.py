"""A TE build that runs its GEMMs split along K, as a user's patched build would (`--te-impl split_k_te_build`): TE
2.20's own Python over the tex emulation, each generic GEMM issued as two half-K GEMMs (planted_te_gemms.split_k_gemm).
It must pass every check the unpatched TE passes, with the same outcome per case."""
from __future__ import annotations

from planted_te_gemms import install, te_python_api

install("split_k")

# The API subset a --te-impl module exposes (te_verify.te.api): TE's own.
_api = te_python_api()
Linear, GroupedLinear, GroupedMLP, ops = _api.Linear, _api.GroupedLinear, _api.GroupedMLP, _api.ops
autocast = _api.autocast
DelayedScaling, Float8CurrentScaling, Format = _api.DelayedScaling, _api.Float8CurrentScaling, _api.Format
is_fp8_available = _api.is_fp8_available
