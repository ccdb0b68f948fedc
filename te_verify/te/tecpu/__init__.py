"""te_verify.te.tecpu: TE's real Python layer on a CPU machine, over a PyTorch emulation of its C++ extension.

`boot()` imports `transformer_engine.pytorch` with `transformer_engine_torch` ("tex") emulated (tex.py,
gemm.py, quantize.py), TE's CUDA touch points rewritten in TE's own modules (rewrite.py, cuda.py) and TE's
triton kernels stubbed. Strict: whatever is not emulated raises `Unemulated`, naming itself and TE's call
site. `record.TexRecorder` records every GEMM at the tex boundary (here or over real TE on a GPU).
"""
from te_verify.te.tecpu.te_import import BootError, BootInfo, boot, booted
from te_verify.te.tecpu.strict import Unemulated

__all__ = ["BootError", "BootInfo", "boot", "booted", "Unemulated"]
