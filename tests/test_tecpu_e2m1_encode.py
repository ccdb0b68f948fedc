"""The emulated E2M1 encoders (te/tecpu/nvfp4.py, looked up by quarter) against E2M1 written from its definition, one
scalar at a time: round to nearest with ties to the even code, and ptx.cuh's stochastic rounding (t = |x| + byte / 256
* spacing(|x|), rounded down on t's spacing, saturating at 6). Every quarter boundary, its fp32 neighbours and every
random byte: where a table is one entry off, a value here lands on it. The decoders against the same definition for
every code and every packed byte (element 2i in the low nibble). Planted: ties that go up, a stochastic table that
saturates one bin late, a byte table with its nibbles swapped."""
import math

import pytest
import torch

from te_verify.te.tecpu import nvfp4

MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def spacing(v: float) -> float:
    return 2.0 if v >= 4.0 else 1.0 if v >= 2.0 else 0.5


def nearest_even(v: float) -> int:
    if math.isnan(v):
        return 7
    a = min(abs(v), 6.0)  # saturating
    # In units of the spacing the grid is consecutive integers whose parity is the code's, so Python's round()
    # (half to even) is E2M1's tie rule; written apart from nvfp4.py's table builder, which compares distances.
    step = spacing(a)
    q = min(round(a / step) * step, 6.0)
    return MAGNITUDES.index(q) + (8 if math.copysign(1.0, v) < 0 else 0)


def stochastic(v: float, byte: int) -> int:
    if math.isnan(v):
        return 7
    a = abs(v)
    t = torch.tensor(a, dtype=torch.float32) + torch.tensor(byte / 256.0, dtype=torch.float32) * spacing(a)
    t = float(t)  # fp32, as the kernel adds
    q = 6.0 if t >= 6.0 else math.floor(t / spacing(t)) * spacing(t)
    return MAGNITUDES.index(q) + (8 if math.copysign(1.0, v) < 0 else 0)


def probe_values() -> torch.Tensor:
    quarters = torch.arange(0, 33, dtype=torch.float32) / 4  # every grid value and midpoint lies on a quarter
    around = torch.cat([quarters, torch.nextafter(quarters, torch.tensor(-1.0)),
                        torch.nextafter(quarters, torch.tensor(99.0))]).clamp(min=0.0)
    special = torch.tensor([float("inf"), float("nan"), 1e-45, 3.4e38])
    magnitudes = torch.cat([around, special])
    return torch.cat([magnitudes, -magnitudes])


def nearest_failures() -> list[str]:
    x = probe_values()
    got = nvfp4.encode_nearest(x).tolist()
    return [f"encode_nearest({v!r}): code {g}, E2M1 says {nearest_even(v)}"
            for v, g in zip(x.tolist(), got) if g != nearest_even(v)]


def stochastic_failures(bytes_: range = range(256)) -> list[str]:
    x = probe_values()
    failures = []
    for byte in bytes_:
        got = nvfp4.encode_stochastic(x, torch.full(x.shape, byte, dtype=torch.uint8)).tolist()
        failures += [f"encode_stochastic({v!r}, byte {byte}): code {g}, E2M1 says {stochastic(v, byte)}"
                     for v, g in zip(x.tolist(), got) if g != stochastic(v, byte)]
    return failures


def test_round_to_nearest_even_is_e2m1s_at_every_boundary():
    assert nearest_failures() == []


def test_stochastic_rounding_is_the_kernels_for_every_byte():
    assert stochastic_failures() == []


def test_ties_that_go_up_fail_naming_the_value(monkeypatch: pytest.MonkeyPatch):
    ties_up = nvfp4.RNE_CODE.clone()
    ties_up[2] = 1  # 0.25 exactly: between codes 0 and 1, E2M1 keeps the even 0
    monkeypatch.setattr(nvfp4, "RNE_CODE", ties_up)
    assert nearest_failures()[:1] == ["encode_nearest(0.25): code 1, E2M1 says 0"]


def test_saturating_one_bin_late_fails_naming_the_value(monkeypatch: pytest.MonkeyPatch):
    late = nvfp4.SR_CODE.clone()
    late[12] = 6  # t in [6, 6.5) is 6.0, code 7
    monkeypatch.setattr(nvfp4, "SR_CODE", late)
    failures = stochastic_failures(range(1))
    assert failures and failures[0] == "encode_stochastic(6.0, byte 0): code 6, E2M1 says 7"


def e2m1_value(code: int) -> float:
    return math.copysign(MAGNITUDES[code & 7], -1.0 if code & 8 else 1.0)  # code 8 is -0


def decode_failures() -> list[str]:
    failures = [f"decode({code}): {got!r}, E2M1 says {e2m1_value(code)!r}"
                for code, got in enumerate(nvfp4.decode(torch.arange(16, dtype=torch.uint8)).tolist())
                if math.copysign(1.0, got) != math.copysign(1.0, e2m1_value(code)) or got != e2m1_value(code)]
    pairs = nvfp4.decode_packed(torch.arange(256, dtype=torch.uint8).reshape(1, 256)).reshape(256, 2).tolist()
    for byte, got in enumerate(pairs):
        want = [e2m1_value(byte & 0xF), e2m1_value(byte >> 4)]
        if [(math.copysign(1.0, v), v) for v in got] != [(math.copysign(1.0, v), v) for v in want]:
            failures.append(f"decode_packed(byte {byte}): {got}, E2M1 says {want}")
    return failures


def test_every_code_and_packed_byte_decodes_to_e2m1s_values():
    assert decode_failures() == []


def test_swapped_nibbles_fail_naming_the_byte(monkeypatch: pytest.MonkeyPatch):
    swapped = nvfp4.BYTE_VALUES.flip(-1).contiguous()
    monkeypatch.setattr(nvfp4, "BYTE_WORDS", swapped.view(torch.int64).reshape(256))
    assert decode_failures()[:1] == ["decode_packed(byte 1): [0.0, 0.5], E2M1 says [0.5, 0.0]"]
