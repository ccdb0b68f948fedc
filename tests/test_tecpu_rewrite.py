"""rewrite.rewrite_source / CudaRewriter on small sources (no TE needed): each rule R1-R12 rewrites what it
should, records (file, line, rule), keeps line numbers, and leaves other code alone; the finder serves only
`transformer_engine.*`; the version gate and the surface loader fail with one-line messages."""
from __future__ import annotations

import textwrap
import traceback
import types

import pytest
import torch

from te_verify.te.tecpu import rewrite, surface, te_import

FILE = "transformer_engine/pytorch/fake.py"


def run(source: str) -> tuple[dict, list[tuple[str, int, str]]]:
    """Rewrite and execute `source` as a TE module with a recognisable shim; return its globals and the sites."""
    sites: list[tuple[str, int, str]] = []
    code = rewrite.rewrite_source(textwrap.dedent(source), FILE, sites)
    shim = types.SimpleNamespace(cuda=types.SimpleNamespace(marker="fake-cuda", current_device=lambda: 0),
                                 on_emulated_device=lambda t: ("on_emulated_device", t),
                                 off_emulated_device=lambda t: ("off_emulated_device", t),
                                 to_emulated_device=lambda t: ("to_emulated_device", t), cuda_version="12.9-emulated")
    scope = {"torch": torch, rewrite.SHIM_NAME: shim}
    exec(code, scope)
    return scope, sites


def rules(sites: list[tuple[str, int, str]]) -> list[tuple[int, str]]:
    assert all(f == FILE for f, _, _ in sites), f"sites name another file: {sites}"
    return [(line, rule.split()[0]) for _, line, rule in sites]


def test_r1_torch_cuda_becomes_the_shim() -> None:
    scope, sites = run("x = 1\nns = torch.cuda\n")
    assert scope["ns"].marker == "fake-cuda", "R1: torch.cuda must be the shim's namespace"
    assert rules(sites) == [(2, "R1")], f"R1 sites: {sites}"


def test_r2_is_cuda_becomes_emulated_device_check() -> None:
    scope, sites = run("t = 5\nflag = t.is_cuda\n")
    assert scope["flag"] == ("on_emulated_device", 5), f"R2: {scope['flag']}"
    assert rules(sites) == [(2, "R2")], f"R2 sites: {sites}"


def test_r3_dot_cuda_call_becomes_emulated_device_transfer() -> None:
    scope, sites = run("t = 7\n\nu = t.cuda(non_blocking=True)\n")
    assert scope["u"] == ("to_emulated_device", 7), f"R3: {scope['u']}"
    assert rules(sites) == [(3, "R3")], f"R3 sites: {sites}"


def test_r4_cuda_string_arguments_and_comparisons_become_cpu() -> None:
    scope, sites = run("""
        a = torch.empty(2, device="cuda")
        b = str("cuda:1")
        c = "cuda" == "cpu"
        d = torch.device("cpu").type != "cuda"
    """)
    assert scope["a"].device.type == "cpu" and scope["b"] == "cpu", f"R4 arguments: {scope['a'].device}, {scope['b']}"
    assert scope["c"] is True and scope["d"] is False, f"R4 comparisons: {scope['c']}, {scope['d']}"
    assert rules(sites) == [(2, "R4"), (3, "R4"), (4, "R4"), (5, "R4")], f"R4 sites: {sites}"


def test_r5_torch_device_cuda_index_becomes_cpu() -> None:
    scope, sites = run("dev = torch.device('cuda', 3)\n")
    assert scope["dev"] == torch.device("cpu"), f"R5: {scope['dev']}"
    assert rules(sites) == [(1, "R5")], f"R5 sites: {sites}"


def test_r6_device_current_device_keyword_becomes_cpu() -> None:
    scope, sites = run("t = torch.zeros(1, device=torch.cuda.current_device())\ni = torch.cuda.current_device()\n")
    assert scope["t"].device.type == "cpu", f"R6: {scope['t'].device}"
    assert scope["i"] == 0, "elsewhere current_device() goes through the shim (R1)"
    assert rules(sites) == [(1, "R6"), (2, "R1")], f"R6 sites: {sites}"


def test_r6_reaches_current_device_inside_the_device_keyword() -> None:
    """TE's quantized_tensor.py (QuantizedTensor.__new__): `device=torch.cuda.current_device() if device is None
    else device`; a tensor made without a device must land on the emulated device, one made with one keeps it."""
    scope, sites = run("""
        def make(device=None):
            return torch.zeros(1, device=torch.cuda.current_device() if device is None else device)
        a, b = make(), make("meta")
    """)
    assert (scope["a"].device.type, scope["b"].device.type) == ("cpu", "meta"), f"R6: {scope['a'].device}, {scope['b'].device}"
    assert rules(sites) == [(3, "R6")], f"R6 sites: {sites}"


def test_r7_cuda_parameter_defaults_become_cpu() -> None:
    scope, sites = run("def f(a, device='cuda', *, other='cuda:0'):\n    return device, other\n")
    assert scope["f"](1) == ("cpu", "cpu"), f"R7: {scope['f'](1)}"
    assert rules(sites) == [(1, "R7"), (1, "R7")], f"R7 sites: {sites}"


def test_r8_positional_current_device_to_a_device_parameter_becomes_cpu() -> None:
    """TE 2.20's nvfp4_tensor.py passes torch.cuda.current_device() positionally to its own get_rht_matrix(flag,
    device); only a same-module function whose parameter at that position is `device` is rewritten."""
    scope, sites = run("""
        def make(flag, device):
            return torch.zeros(1, device=device)
        def other(flag, index):
            return index
        t = make(True, torch.cuda.current_device())
        i = other(True, torch.cuda.current_device())
    """)
    assert scope["t"].device.type == "cpu", f"R8: {scope['t'].device}"
    assert scope["i"] == 0, "a parameter not named device keeps current_device() (through the shim, R1)"
    assert rules(sites) == [(6, "R8"), (7, "R1")], f"R8 sites: {sites}"


def test_r9_torch_version_cuda_is_the_emulated_cuda_version() -> None:
    scope, sites = run("ok = torch.version.cuda\nv = torch.version.git_version\n")
    assert scope["ok"] == "12.9-emulated", f"R9: {scope['ok']}"
    assert rules(sites) == [(1, "R9")], f"R9 sites: {sites}"


def test_r10_argumentless_is_autocast_enabled_reads_the_emulated_devices_autocast() -> None:
    scope, sites = run("a = torch.is_autocast_enabled()\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n"
                       "    b = torch.is_autocast_enabled()\nc = torch.is_autocast_enabled('cpu')\n")
    assert (scope["a"], scope["b"], scope["c"]) == (False, True, False), f"R10: {scope}"
    assert rules(sites) == [(1, "R10"), (3, "R10")], f"R10 sites: {sites}"


def test_r11_is_cpu_becomes_off_emulated_device_check() -> None:
    """TE's Float8 dequantize has a CPU fallback (`if tensor._data.is_cpu`) a GPU never takes; on the emulated
    device it must not either, or tex.dequantize goes untested."""
    scope, sites = run("t = 5\nflag = t.is_cpu\n")
    assert scope["flag"] == ("off_emulated_device", 5), f"R11: {scope['flag']}"
    assert rules(sites) == [(2, "R11")], f"R11 sites: {sites}"


def test_r12_names_imported_from_torch_cuda_are_the_shims() -> None:
    """TE's distributed.py binds `_lazy_init` from torch.cuda at import: without R12 the real one runs (and raises
    "Torch not compiled with CUDA enabled" on a CPU torch) where every `torch.cuda.x` is the fake."""
    scope, sites = run("import os\nfrom torch.cuda import marker, current_device as device_index\n")
    assert (scope["marker"], scope["device_index"]()) == ("fake-cuda", 0), "R12: names must come from the shim"
    assert rules(sites) == [(2, "R12")], f"R12 sites: {sites}"


def test_line_numbers_are_kept() -> None:
    source = "x = torch.cuda\n\ny = torch.device('cuda', 0)\n\n\ndef boom():\n    raise ValueError('here')\n"
    scope, sites = run(source)
    with pytest.raises(ValueError) as info:
        scope["boom"]()
    frame = traceback.extract_tb(info.tb)[-1]
    assert (frame.filename, frame.lineno) == (FILE, 7), f"raise reported at {frame.filename}:{frame.lineno}, not {FILE}:7"
    assert [line for _, line, _ in sites] == [1, 3], f"sites: {sites}"


def test_other_code_is_left_alone() -> None:
    scope, sites = run("""
        n = 3
        msg = f"expected cuda, got {n} cuda tensors"
        key = {"cuda": 1}["cuda"]
        s = "cuda"
        other = torch.device("cpu").type
        is_cuda = "x"
        label = f"{'cuda'}"
    """)
    assert sites == [], f"rewrote code it should not touch: {sites}"
    assert (scope["msg"], scope["key"], scope["s"], scope["label"]) == ("expected cuda, got 3 cuda tensors", 1, "cuda", "cuda")


def test_finder_serves_only_transformer_engine() -> None:
    finder = rewrite.TEFinder(types.SimpleNamespace(), rewrite.RewriteLog(), {})
    assert finder.find_spec("json", None) is None, "a non-TE module went through the rewriting finder"
    assert finder.find_spec("transformer_engine_torch", None) is None, "the tex module is not TE source"
    spec = finder.find_spec("transformer_engine.pytorch.triton.pad", None)
    assert isinstance(spec.loader, rewrite.StubLoader), f"triton kernels must be stubbed: {spec.loader}"


def test_torch_cuda_outside_te_is_the_real_one() -> None:
    """Booted or not, this module's torch.cuda is torch's own (the rewrite is lexical, in TE's modules only)."""
    import torch.cuda as real_cuda

    assert torch.cuda is real_cuda and torch.cuda.is_available() is False, "torch.cuda outside TE was replaced"


def test_unknown_surface_version_is_one_line() -> None:
    with pytest.raises(surface.SurfaceError) as info:
        surface.load("9.9.9")
    msg = str(info.value)
    assert "\n" not in msg and "9.9.9" in msg, f"message: {msg!r}"
    assert "2.20.2" in msg and "gen_tex_surface.py 9.9.9" in msg, f"message names no way out: {msg!r}"


def test_too_old_te_names_minimum_version() -> None:
    with pytest.raises(te_import.BootError) as info:
        te_import.check_version("2.8.0")
    msg = str(info.value)
    assert "\n" not in msg and "2.8.0" in msg and te_import.MIN_TE_VERSION in msg, f"message: {msg!r}"
