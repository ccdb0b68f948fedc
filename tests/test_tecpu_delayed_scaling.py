"""tex.fused_amax_and_scale_update_after_reduction against common/recipe/delayed_scaling.cu kernel_bulk, on
hand-computed histories, and against TE's own pure-Python path quantization._amax_and_scale_update (the one
thunder calls). kernel_bulk per scale slot (history H of length L, column `slot`, stride num_scale):
  last = buffer[offset + slot] if that is non-zero else H[0]
  if last != 0: roll in place, H' = [0, H[2], ..., H[L-1], last], and amax = fmaxf over H[1..L-1], last
  ("most_recent": amax = last; fmaxf drops NaN operands)
  scale = scaled_max / amax if amax finite and > 0, else the previous scale; an infinite scale -> FLT_MAX
  scaled_max = fp8_max * 2^-margin (fp32), buffer offsets run over all slots of the preceding tensors.
The two TE paths differ where noted below (test_python_path_*): those tests pin both behaviours."""
from __future__ import annotations

import types

import pytest
import torch

from te_verify.te import tecpu

FLT_MAX = torch.finfo(torch.float32).max
INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.common.recipe import DelayedScaling
    from transformer_engine.pytorch import quantization

    return types.SimpleNamespace(tex=tex, DelayedScaling=DelayedScaling, python_update=quantization._amax_and_scale_update,
                                 dtype={"e4m3": tex.DType.kFloat8E4M3, "e5m2": tex.DType.kFloat8E5M2})


def f32(a: float, b: float = 1.0) -> float:
    """a / b in fp32 (how the kernel computes scale)."""
    return float(torch.tensor(a, dtype=torch.float32) / torch.tensor(b, dtype=torch.float32))


def kernel(te, histories: list[list[list[float]]], scales: list[list[float]], buffer: list[float] | None,
           algo: str = "max", fmt: str = "e4m3", margin: float = 0) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Run the emulated tex call on rows-of-slots histories; return the updated histories and scales as lists."""
    hs = [torch.tensor(h, dtype=torch.float32) for h in histories]
    ss = [torch.tensor(s, dtype=torch.float32) for s in scales]
    buf = torch.tensor(buffer, dtype=torch.float32) if buffer is not None else None
    te.tex.fused_amax_and_scale_update_after_reduction(buf, hs, ss, algo, te.dtype[fmt], margin)
    return [h.tolist() for h in hs], [s.tolist() for s in ss]


def python_path(te, history: list[float], scale: float, algo: str = "max", margin: int = 0,
                fp8_max: float = 448.0) -> tuple[list[float], float]:
    h = torch.tensor(history, dtype=torch.float32).reshape(-1, 1)
    s = torch.tensor([scale], dtype=torch.float32)
    te.python_update(h, s, fp8_max, te.DelayedScaling(amax_history_len=len(history), amax_compute_algo=algo, margin=margin))
    return h.flatten().tolist(), s.item()


def same(a: list, b: list) -> bool:
    """Equal lists of floats, NaN equal to NaN."""
    return torch.equal(torch.tensor(a).nan_to_num(nan=-1.0), torch.tensor(b).nan_to_num(nan=-1.0))


def col(values: list[float]) -> list[list[float]]:
    return [[v] for v in values]


# (history H[0..3] of one slot, new amax in the buffer, algo, format, margin, previous scale) ->
# (expected history, expected scale), hand-computed from kernel_bulk.
CASES = [
    pytest.param([0, 9, 1, 2], 3, "max", "e4m3", 0, 7.0, [0, 1, 2, 3], f32(448, 9), id="max-counts-dropped-H1"),
    pytest.param([0, 1, 5, 2], 3, "max", "e4m3", 0, 7.0, [0, 5, 2, 3], f32(448, 5), id="max-window"),
    pytest.param([4, 1, 5, 2], 0, "max", "e4m3", 0, 7.0, [0, 5, 2, 4], f32(448, 5), id="zero-buffer-uses-H0"),
    pytest.param([0, 1, 5, 2], 0, "max", "e4m3", 0, 7.0, [0, 1, 5, 2], 7.0, id="no-new-amax-no-roll"),
    pytest.param([0, 1, 5, 2], 3, "most_recent", "e4m3", 0, 7.0, [0, 5, 2, 3], f32(448, 3), id="most-recent"),
    pytest.param([0, 1, 5, 2], 0, "most_recent", "e4m3", 0, 7.0, [0, 1, 5, 2], 7.0, id="most-recent-no-new"),
    pytest.param([0, 1, 5, 2], 3, "max", "e4m3", 1, 7.0, [0, 5, 2, 3], f32(224, 5), id="margin-1"),
    pytest.param([0, 1, 5, 2], 3, "max", "e5m2", 2, 7.0, [0, 5, 2, 3], f32(14336, 5), id="e5m2-margin-2"),
    pytest.param([0, 1, 5, 2], INF, "max", "e4m3", 0, 7.0, [0, 5, 2, INF], 7.0, id="inf-amax-keeps-scale"),
    pytest.param([0, 1, 5, 2], NAN, "most_recent", "e4m3", 0, 7.0, [0, 5, 2, NAN], 7.0, id="nan-most-recent-keeps"),
    pytest.param([0, 1, 5, 2], NAN, "max", "e4m3", 0, 7.0, [0, 5, 2, NAN], f32(448, 5), id="nan-max-fmaxf-drops-nan"),
    pytest.param([0, 0, 0, 0], 1e-45, "max", "e4m3", 0, 7.0, [0, 0, 0, 1e-45], FLT_MAX, id="inf-scale-flt-max"),
    pytest.param([0, 1, 5, 2], 0, "max", "e4m3", 0, INF, [0, 1, 5, 2], FLT_MAX, id="inf-previous-scale-flt-max"),
    pytest.param([0], 3, "max", "e4m3", 0, 7.0, [0], f32(448, 3), id="length-1"),
]


@pytest.mark.parametrize("history, new, algo, fmt, margin, prev, want_history, want_scale", CASES)
def test_kernel_bulk_single_slot(te, history, new, algo, fmt, margin, prev, want_history, want_scale) -> None:
    (h,), ((s,),) = kernel(te, [col(history)], [[prev]], [new], algo, fmt, margin)
    got = [r[0] for r in h]
    want_history = [float(torch.tensor(v, dtype=torch.float32)) for v in want_history]
    assert same(got, want_history), f"history after update: {got}, want {want_history}"
    assert s == want_scale, f"scale after update: {s}, want {want_scale}"


def test_kernel_bulk_several_tensors_and_slots_use_buffer_offsets(te) -> None:
    histories = [[[0, 0], [1, 6], [2, 1]], [[0, 0, 5], [3, 0, 0], [0, 8, 1]]]
    buffer = [4, 0, 1, 2, 0]  # tensor 0 slots 0-1, then tensor 1 slots 0-2
    hs, ss = kernel(te, histories, [[1.0, 1.0], [2.0, 2.0, 2.0]], buffer)
    assert hs[0] == [[0, 0], [2, 6], [4, 1]], f"tensor 0 history (slot 0 rolled with 4, slot 1 untouched): {hs[0]}"
    assert ss[0] == [112.0, 1.0], f"tensor 0 scales (448/4, kept): {ss[0]}"
    assert hs[1] == [[0, 0, 0], [0, 8, 1], [1, 2, 5]], f"tensor 1 history (new 1, 2, then H0=5): {hs[1]}"
    assert ss[1] == [f32(448, 3), 56.0, f32(448, 5)], f"tensor 1 scales (448/3, 448/8, 448/5): {ss[1]}"


def test_kernel_bulk_rejects_unknown_algo(te) -> None:
    with pytest.raises(RuntimeError, match="Unsupported amax compute algorithm"):
        kernel(te, [col([0, 1])], [[1.0]], [1.0], algo="mean")


def ulps(a: float, b: float) -> int:
    """Distance between two positive fp32 values in units in the last place."""
    bits = torch.tensor([a, b], dtype=torch.float32).view(torch.int32)
    return abs(int(bits[0]) - int(bits[1]))


@pytest.mark.parametrize("algo, margin", [("max", 0), ("most_recent", 0), ("max", 2)])
def test_python_path_agrees_when_a_finite_new_amax_arrived(te, algo: str, margin: int) -> None:
    """Same history; the scale to 1 ulp (see test_python_path_scale_is_reciprocal_times_max)."""
    torch.manual_seed(margin)
    for trial in range(5):
        history = (torch.rand(6) * 10).tolist()  # H[0] > 0: the new amax, in place (the Python path reads H[0])
        (h,), ((s,),) = kernel(te, [col(history)], [[3.0]], [0.0], algo, "e4m3", margin)
        py_h, py_s = python_path(te, history, 3.0, algo, margin)
        assert same([r[0] for r in h], py_h), f"trial {trial}: histories differ: tex {h} vs Python {py_h}"
        assert ulps(s, py_s) <= 1, f"trial {trial}: scales differ by {ulps(s, py_s)} ulp: tex {s} vs Python {py_s}"


def test_python_path_scale_is_reciprocal_times_max(te) -> None:
    """Difference between TE's two paths: _default_sf_compute's `fp8_max / amax` (Python float over a tensor)
    is torch's reciprocal(amax) * fp8_max, two roundings; kernel_bulk divides once, correctly rounded
    (delayed_scaling.cu is not among TE's --use_fast_math sources). For amax = 6.1 they differ by 1 ulp."""
    _, py_s = python_path(te, [6.1, 0, 0, 0], 1.0, "max")
    (_,), ((s,),) = kernel(te, [col([6.1, 0, 0, 0])], [[1.0]], [0.0], "max")
    amax = torch.tensor(6.1, dtype=torch.float32)
    assert py_s == float(amax.reciprocal() * 448.0), f"Python path scale {py_s}"
    assert s == f32(448, 6.1), f"tex kernel_bulk scale {s}"
    assert ulps(s, py_s) == 1, f"the two TE paths now agree on 448/6.1 ({s}): update this test"


def test_python_path_rolls_and_rescales_without_a_new_amax(te) -> None:
    """Difference between TE's two paths: with H[0] == 0 the kernel neither rolls nor rescales (last_amax == 0);
    _amax_and_scale_update always rolls and, with "max", rescales from the history's max."""
    py_h, py_s = python_path(te, [0, 1, 5, 2], 7.0, "max")
    (h,), ((s,),) = kernel(te, [col([0, 1, 5, 2])], [[7.0]], [0.0], "max")
    assert (py_h, py_s) == ([0, 5, 2, 0], f32(448, 5)), f"Python path: {py_h}, {py_s}"
    assert ([r[0] for r in h], s) == ([0, 1, 5, 2], 7.0), f"tex kernel_bulk: {h}, {s}"


def test_python_path_propagates_nan_where_the_kernel_drops_it(te) -> None:
    """Difference between TE's two paths: torch.max propagates NaN (scale kept); kernel_bulk's fmaxf drops it
    (scale from the other entries; the tex side is test_kernel_bulk_single_slot[nan-max-fmaxf-drops-nan])."""
    py_h, py_s = python_path(te, [NAN, 1, 5, 2], 7.0, "max")
    assert same(py_h, [0, 5, 2, NAN]) and py_s == 7.0, f"Python path: {py_h}, {py_s}"
    assert py_s != f32(448, 5), "the two TE paths agree on a NaN amax after all: drop this test"


def test_python_path_divides_margin_after_overflow(te) -> None:
    """Difference between TE's two paths: the Python path computes (fp8_max / amax) / 2**margin, which overflows
    to inf (-> FLT_MAX) for amax = 1e-36 where the kernel's (fp8_max * 2^-margin) / amax = 224 / 1e-36 is finite."""
    py_h, py_s = python_path(te, [1e-36, 0, 0, 0], 7.0, "max", margin=1)
    (h,), ((s,),) = kernel(te, [col([1e-36, 0, 0, 0])], [[7.0]], [0.0], "max", margin=1)
    assert py_s == FLT_MAX, f"Python path scale: {py_s}"
    assert s == f32(224, 1e-36) and s < FLT_MAX, f"tex kernel_bulk scale: {s}"
