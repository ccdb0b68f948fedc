"""A pure-PyTorch TE build: te_verify.te.reference with every GEMM issued as planted_ref_gemms' "split_n"
(`--te-impl split_n_ref_build`)."""
from __future__ import annotations

from planted_ref_gemms import install

from te_verify.te.reference import *  # noqa: F401,F403 (the TE API subset a --te-impl module exposes)

install("split_n", __name__)
