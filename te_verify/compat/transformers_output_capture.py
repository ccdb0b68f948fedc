"""transformers 5.x under thunder: the output-capture context variable replaced by a stateless one.

transformers 5's `@capture_outputs` (every Llama forward) stores a dict on the module-global
`transformers.utils.output_capturing._active_collector` and clears it after the forward. When
`torch.compiler.is_compiling()` is true (thunder's interpreter makes it so) that variable keeps the dict in a plain
attribute, and thunder 0.2.6's epilogue refuses to write a dict back to a global (`thunder/core/jit_ext.py:2005`,
"trying to set .global_var of ProvenanceRecord(... '_active_collector') to object of type dict"). The variable only
serves hidden-state and attention capture, which no case asks for: the stand-in holds nothing, and raises if a
forward ever asks it to capture, so the step cannot silently drop outputs. Applied by the hf_peft family whenever it
builds a model (every backend then runs the same transformers code); guarded to transformers 5.x and to the
variable's class; listed in the report header.
"""
from __future__ import annotations

import importlib
import importlib.metadata

from te_verify.compat import record

GUARDED_MAJOR = "5"
STEP = ("transformers-output-capture: transformers 5.x keeps its output-capture dict on a module-global variable "
        "thunder 0.2.6 cannot write back; transformers.utils.output_capturing._active_collector is replaced by a "
        "stateless stand-in that raises if hidden states or attentions are ever requested")


class OutputCaptureStepError(RuntimeError):
    """The installed transformers is not what the step is written for; one line says why."""


class StatelessCollector:
    """Holds no collector: `set` accepts only the empty dict a forward without capture requests."""

    __te_verify_step__ = True

    def get(self) -> None:
        return None

    def set(self, value: dict) -> None:
        if value:
            raise OutputCaptureStepError(f"transformers output capture requested ({sorted(value)}), which te_verify's "
                                         f"transformers-output-capture step turns off")
        return None

    def reset(self, token: None) -> None:
        return None


def apply() -> None:
    """Install the stand-in (idempotent); raise OutputCaptureStepError on a transformers it is not written for."""
    version = importlib.metadata.version("transformers")
    if version.split(".")[0] != GUARDED_MAJOR:
        raise OutputCaptureStepError(f"transformers {version}: the output-capture step is written for transformers "
                                     f"{GUARDED_MAJOR}.x; pin transformers as constraints.txt does")
    module = importlib.import_module("transformers.utils.output_capturing")
    current = getattr(module, "_active_collector", None)
    if getattr(current, "__te_verify_step__", False):
        return
    if type(current).__name__ != "CompileableContextVar":
        raise OutputCaptureStepError(f"transformers {version}: output_capturing._active_collector is "
                                     f"{type(current).__name__}, not the CompileableContextVar the step replaces")
    module._active_collector = StatelessCollector()
    record(STEP)
