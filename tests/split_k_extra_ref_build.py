"""A planted pure-PyTorch TE build: te_verify.te.reference with every GEMM issued as planted_ref_gemms' "split_k_extra"
(`--te-impl split_k_extra_ref_build`)."""
from __future__ import annotations

from planted_ref_gemms import install

from te_verify.te.reference import *  # noqa: F401,F403 (the TE API subset a --te-impl module exposes)

install("split_k_extra", __name__)
