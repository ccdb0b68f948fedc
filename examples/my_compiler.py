"""A worked example: your own single-process backend, certified by te_verify (README, "Your own backend").

    te-verify run --tier smoke --backend examples.my_compiler:MyCompiler
"""
import torch


class MyCompiler:
    name = "my_compiler"

    def available(self):
        return True, ""  # or (False, "why not"): its cases skip with that reason

    def prepare(self, model, spec):  # once per case; every iteration, replay and probe reuses it
        return torch.compile(model, backend="aot_eager")
