"""Strictness of the emulation: an unemulated tex function, torch.cuda attribute or triton kernel raises
Unemulated naming itself and TE's call site; a name outside the version's tex surface is an AttributeError, as
on a GPU; the tex enums carry the generated surface's values."""
from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import torch

from te_verify.te import tecpu

SURFACE = Path(tecpu.__file__).parent / "surfaces" / "tex_2.20.2.json"
CALL_SITE = re.compile(r"called from (transformer_engine/pytorch/[\w/]+\.py):(\d+) in \w+")


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    info = tecpu.boot()
    import transformer_engine.pytorch as te_pytorch
    import transformer_engine_torch as tex

    return types.SimpleNamespace(info=info, te=te_pytorch, tex=tex)


def te_call_site(exc: BaseException) -> tuple[str, int]:
    """TE's file and line named by an Unemulated message (fails the test when there is none)."""
    match = CALL_SITE.search(str(exc))
    assert match, f"no TE call site in the message: {exc}"
    return match.group(1), int(match.group(2))


def source_line(te, relative: str, line: int) -> str:
    return (Path(te.info.te_path) / relative.removeprefix("transformer_engine/")).read_text().splitlines()[line - 1]


def test_direct_call_of_unemulated_tex_function_names_it(te) -> None:
    with pytest.raises(tecpu.Unemulated,
                       match=r"transformer_engine_torch\.device_supports_multicast is not emulated"):
        te.tex.device_supports_multicast()


def test_te_userbuffers_names_function_and_te_call_site(te) -> None:
    """TE's comm+GEMM overlap (te.initialize_ub, Userbuffers) reaches tex.device_supports_multicast, which the
    emulation lacks (gelu, layernorm_fwd, situglu, scaled_srelu, scaled_softmax_forward, fused_rope_forward and
    fused_topk_with_score_function_fwd, the examples before, are emulated: te/tecpu/activation.py, norm.py,
    scaled_activation.py, attention.py, rope.py, fused_router.py)."""
    with pytest.raises(tecpu.Unemulated) as info:
        te.te.initialize_ub([64, 128], 1)
    assert "transformer_engine_torch.device_supports_multicast" in str(info.value), f"message: {info.value}"
    path, line = te_call_site(info.value)
    assert "tex.device_supports_multicast" in source_line(te, path, line), \
        f"{path}:{line} is not where TE calls tex.device_supports_multicast"


def test_name_outside_the_surface_is_attribute_error(te) -> None:
    with pytest.raises(AttributeError, match="no_such_tex_function"):
        te.tex.no_such_tex_function  # noqa: B018


def test_unemulated_torch_cuda_attribute_names_it_and_te_call_site(te) -> None:
    from transformer_engine.pytorch import distributed

    with pytest.raises(tecpu.Unemulated, match=r"torch\.cuda\.CUDAGraph is not emulated") as info:
        distributed.graph_safe_rng_available()
    path, line = te_call_site(info.value)
    assert path == "transformer_engine/pytorch/distributed.py", f"call site {path}:{line}"
    assert "torch.cuda.CUDAGraph" in source_line(te, path, line), f"{path}:{line} does not touch torch.cuda.CUDAGraph"


def test_stubbed_triton_kernel_raises_when_called(te) -> None:
    from transformer_engine.pytorch.triton.pad import pad_columnwise_scale_inv

    assert "transformer_engine.pytorch.triton.pad" in te.info.stubbed_modules, f"stubbed: {te.info.stubbed_modules}"
    with pytest.raises(tecpu.Unemulated, match=r"transformer_engine\.pytorch\.triton\.pad\.pad_columnwise_scale_inv"):
        pad_columnwise_scale_inv(torch.zeros(4, 4))


def test_tex_enums_equal_the_surface(te) -> None:
    enums = json.loads(SURFACE.read_text())["enums"]
    assert "DType" in enums, "surface lacks DType"
    for name, members in enums.items():
        got = {m.name: int(m.value) for m in getattr(te.tex, name)}
        assert got == members, f"transformer_engine_torch.{name}: {got} != surface {members}"
    assert int(te.tex.DType.kFloat8E4M3) == 7 and int(te.tex.DType.kBFloat16) == 6, "DType values (2.20.2)"
