"""Every cast TE asks of tex, seen one by one: the wrappers an observer of quantizations patches over tex's
`quantize`, `split_quantize` (one cast per chunk) and `bgrad_quantize` (the cast beside the bias gradient).

`note(source, quantizer, output)` is called after each cast that ran; a `quantize` whose no-op flag is set casts
nothing (TE skips the cast and its amax), so it is not noted.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

Note = Callable[[torch.Tensor, Any, Any], None]


def cast_wrappers(note: Note) -> tuple[tuple[str, Callable[[Callable], Callable]], ...]:
    """(tex function name, wrap(original)) for patch_tex, each calling `note` per cast."""

    def wrap_quantize(original: Callable) -> Callable:
        def quantize(tensor, quantizer, output=None, noop=None, *args: Any, **kwargs: Any):
            out = original(tensor, quantizer, output, noop, *args, **kwargs)
            if noop is None or not bool(noop.reshape(-1)[0] == 1):
                note(tensor, quantizer, out)
            return out
        return quantize

    def wrap_split(original: Callable) -> Callable:
        def split_quantize(tensor, split_sections, quantizer_list, *args: Any, **kwargs: Any):
            outs = original(tensor, split_sections, quantizer_list, *args, **kwargs)
            for chunk, q, out in zip(torch.split(tensor, list(split_sections)), quantizer_list, outs):
                note(chunk, q, out)
            return outs
        return split_quantize

    def wrap_bgrad(original: Callable) -> Callable:
        def bgrad_quantize(input, quantizer):  # noqa: A002 -- pybind's argument name
            grad_bias, out = original(input, quantizer)
            note(input, quantizer, out)
            return [grad_bias, out]
        return bgrad_quantize

    return (("quantize", wrap_quantize), ("split_quantize", wrap_split), ("bgrad_quantize", wrap_bgrad))
