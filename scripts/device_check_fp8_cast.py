#!/usr/bin/env python3
"""Device check (an NVIDIA GPU of sm89+, CuPy and a CUDA torch): TE's FP8 element cast on the hardware against the
cast the tex emulation uses, over every fp32 bit pattern.

TE's MXFP8 and FP8 block-scaling kernels convert x * scale with PTX cvt.rn.satfinite.{e4m3x2,e5m2}x2.f32 (round to
nearest even, saturating to the largest finite value, NaN kept). The emulation (te_verify/te/fp8.py, called by
mxfp8.py and block_fp8.py) clamps to +-max and casts with torch's CPU float8 conversion. This runs the PTX
instruction on the GPU for all 2^32 inputs, chunk by chunk, and compares every byte with the emulation's on the
CPU. Prints (and writes to $OUT/fp8_cast.json if OUT is set) the mismatches per format and input class, with the
first few inputs. Usage: python3 scripts/device_check_fp8_cast.py [--chunk-bits 26]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import cupy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from te_verify.te import fp8  # noqa: E402

KERNEL = r"""
extern "C" __global__ void cvt(const float* x, unsigned char* e4m3, unsigned char* e5m2, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned short a, b;
  // cvt d, hi, lo: d[7:0] converts lo
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(a) : "f"(0.0f), "f"(x[i]));
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(b) : "f"(0.0f), "f"(x[i]));
  e4m3[i] = (unsigned char)(a & 0xFF);
  e5m2[i] = (unsigned char)(b & 0xFF);
}
"""


def classify(x: torch.Tensor) -> torch.Tensor:
    """0 NaN, 1 inf, 2 zero, 3 fp32 subnormal, 4 normal."""
    a = x.abs()
    return torch.where(torch.isnan(x), 0, torch.where(torch.isinf(x), 1, torch.where(a == 0, 2, torch.where(
        a < torch.finfo(torch.float32).tiny, 3, 4))))


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk-bits", type=int, default=26)
    args = parser.parse_args()
    kernel = cupy.RawKernel(KERNEL, "cvt")
    chunk = 1 << args.chunk_bits
    names = ["nan", "inf", "zero", "subnormal", "normal"]
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "inputs": 0,
              "mismatches": {f: {n: 0 for n in names} for f in ("e4m3", "e5m2")}, "examples": []}
    start = time.time()
    for first in range(0, 1 << 32, chunk):
        bits = torch.arange(first, first + chunk, dtype=torch.int64, device="cuda").to(torch.int32)
        x = bits.view(torch.float32)
        e4m3 = torch.empty(chunk, dtype=torch.uint8, device="cuda")
        e5m2 = torch.empty(chunk, dtype=torch.uint8, device="cuda")
        kernel(((chunk + 255) // 256,), (256,), (cupy.asarray(x), cupy.asarray(e4m3), cupy.asarray(e5m2),
                                                 cupy.int64(chunk)))
        torch.cuda.synchronize()
        x_cpu = x.cpu()
        for name, hw, dtype in (("e4m3", e4m3.cpu(), torch.float8_e4m3fn), ("e5m2", e5m2.cpu(), torch.float8_e5m2)):
            emulated = fp8.quantize(x_cpu, 1.0, dtype).view(torch.uint8)
            bad = hw != emulated
            kinds = classify(x_cpu[bad])
            for k, n in enumerate(names):
                report["mismatches"][name][n] += int((kinds == k).sum())
            for i in bad.nonzero().flatten()[:2].tolist():
                if len(report["examples"]) < 12:
                    report["examples"].append({"format": name, "bits": hex(int(bits[i]) & 0xFFFFFFFF),
                                               "value": float(x_cpu[i]), "hardware": int(hw[i]),
                                               "emulated": int(emulated[i])})
        report["inputs"] += chunk
    report["seconds"] = round(time.time() - start, 1)
    return report


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fp8_cast.json").write_text(json.dumps(result, indent=1))
