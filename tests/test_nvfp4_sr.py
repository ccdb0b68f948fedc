"""checks.nvfp4_sr against NVFP4 stochastic quantizations made here (the tex emulation's format functions, and an
independent draw written differently), clean and with one planted fault each; and the reference's replay of a run's
rounding choices (te.reference.sr_replay)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from te_verify.checks.nvfp4_sr import nvfp4_stochastic_rounding, rounding_choices
from te_verify.probes.nvfp4_sr import StochasticQuantization, StoredCopy
from te_verify.te.reference import block, block_recipe
from te_verify.te.reference.sr_replay import RoundingReplay
from te_verify.te.tecpu import nvfp4

RHT = (torch.diag(torch.tensor(block.RHT_SIGNS, dtype=torch.float32))
       @ torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=torch.float32)
       / 4).to(torch.bfloat16)


def _source(seed: int, shape=(32, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _emulated(x: torch.Tensor, bits) -> StoredCopy:
    """A copy by the tex emulation's NVFP4 quantize; `bits(shape)`: its random bytes (None: round to nearest)."""
    amax = x.abs().float().max().reshape(1)
    data, scales = nvfp4.quantize(x, amax, False, bits(tuple(x.shape)))
    return StoredCopy(nvfp4.decode(nvfp4.unpack(data)), scales.view(torch.float8_e4m3fn).float(), float(amax))


def _uniform_bytes(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


def _independent(x: torch.Tensor, seed: int) -> StoredCopy:
    """Stochastic rounding written otherwise: a continuous uniform draw against the fractional position."""
    amax = x.abs().float().max()
    scaled, s_b = block.nvfp4_scaled(x, amax, False)
    lower, upper = block.e2m1_neighbours(scaled)
    p = (scaled.abs() - lower) / torch.where(upper > lower, upper - lower, 1.0)
    up = torch.rand(scaled.shape, generator=torch.Generator().manual_seed(seed)) < p
    values = torch.where(up, upper, lower) * torch.where(torch.signbit(scaled), -1.0, 1.0)
    return StoredCopy(values, s_b[:, ::16], float(amax))


def _quantization(x: torch.Tensor, make, phase: str = "backward") -> StochasticQuantization:
    col = nvfp4.hadamard(x.t().contiguous(), RHT)
    return StochasticQuantization(x, False, True, 1, phase, make(x), make(col))


def _verdict(*quantizations, gradient_gemms: bool = True):
    got = SimpleNamespace(observations={"nvfp4_sr": {"stochastic": list(quantizations), "counts": {}}})
    return nvfp4_stochastic_rounding("case", "te_eager", got, gradient_gemms)


def _emulation(seed: int):
    return lambda x: _emulated(x, _uniform_bytes(seed))


def test_clean_emulated_stochastic_rounding_passes_with_figures():
    v = _verdict(*(_quantization(_source(s), _emulation(s)) for s in range(3)))
    assert v.ok, v.message
    assert v.figures["nvfp4_sr_quantizations"] == 3 and v.figures["nvfp4_sr_copies"] == 6
    assert v.figures["nvfp4_sr_elements"] == 6 * 32 * 64


def test_stochastic_rounding_written_differently_passes():
    v = _verdict(*(_quantization(_source(s), lambda x, s=s: _independent(x, s + 100)) for s in range(3)))
    assert v.ok, v.message


def test_always_rounding_down_is_biased():
    v = _verdict(_quantization(_source(0), lambda x: _emulated(x, lambda shape: torch.zeros(shape, dtype=torch.uint8))))
    assert not v.ok and "biased" in v.message and "rowwise copy" in v.message


def test_rounding_to_nearest_is_not_stochastic():
    v = _verdict(_quantization(_source(0), lambda x: _emulated(x, lambda shape: None)))
    assert not v.ok and "not stochastic: 0 of" in v.message


def test_a_value_beyond_its_neighbours_fails_naming_it():
    def beyond(x):
        c = _emulated(x, _uniform_bytes(0))
        values = c.values.clone()
        values[3, 5] = 6.0 if values[3, 5].abs() < 4 else 0.5  # off both neighbours of any value it rounded
        return StoredCopy(values, c.scales, c.amax)
    v = _verdict(_quantization(_source(0), beyond))
    assert not v.ok and "1 elements are not an E2M1 neighbour" in v.message and "first (3, 5)" in v.message


def test_a_wrong_block_scale_fails():
    def doubled(x):
        c = _emulated(x, _uniform_bytes(0))
        scales = c.scales.clone()
        scales[1, 1] *= 2
        return StoredCopy(c.values, scales, c.amax)
    v = _verdict(_quantization(_source(0), doubled))
    assert not v.ok and "block scales differ" in v.message and "first block (1, 1)" in v.message


def test_stochastic_rounding_in_a_forward_call_fails():
    v = _verdict(_quantization(_source(0), _emulation(0), phase="forward"))
    assert not v.ok and "in a forward call" in v.message


def test_no_stochastic_quantization_is_not_observed():
    v = _verdict()
    assert not v.ok and "not observed" in v.message and v.figures["nvfp4_sr_quantizations"] == 0


def test_a_case_without_gradient_gemms_rounds_nothing_and_says_so():
    """No dgrad or wgrad in the oracle: no gradient to round, a pass naming that; a stochastic quantization the run
    made anyway is still judged (a biased one fails)."""
    v = _verdict(gradient_gemms=False)
    assert v.ok and v.figures["nvfp4_sr_compared"].startswith("nothing: the case needs no gradient GEMM")
    biased = _quantization(_source(0), lambda x: _emulated(x, lambda shape: torch.zeros(shape, dtype=torch.uint8)))
    v = _verdict(biased, gradient_gemms=False)
    assert not v.ok and "biased" in v.message


def test_reference_replays_the_runs_rounding_exactly_on_the_same_source():
    x = _source(7)
    q = _quantization(x, _emulation(7))
    got = SimpleNamespace(observations={"nvfp4_sr": {"stochastic": [q]}})
    recipe = block_recipe.NVFP4BlockScaling()
    with pytest.raises(ValueError, match="replays a run's"):
        block_recipe.quantize_copy(x, recipe, "grad_output")
    with block_recipe.replaying(RoundingReplay(rounding_choices(got))):
        copy = block_recipe.quantize_copy(x, recipe, "grad_output")
    assert torch.equal(copy.data, q.rowwise.values)
    assert torch.equal(copy.col_data.t(), q.columnwise.values)


def test_replay_takes_the_nearest_unused_source_of_the_shape():
    a, b = _source(1), _source(2)
    choices = rounding_choices(SimpleNamespace(observations={"nvfp4_sr": {"stochastic": [
        _quantization(a, _emulation(1)), _quantization(b, _emulation(2))]}}))
    replay = RoundingReplay(choices)
    assert torch.equal(replay.choices(b + 0.01)[0], choices[1].up_row)
    assert torch.equal(replay.choices(b)[0], choices[0].up_row)  # b's is used: the one left
    with pytest.raises(ValueError, match=r"no stochastic quantization of that shape left"):
        replay.choices(b)
