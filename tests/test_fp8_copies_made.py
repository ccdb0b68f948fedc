"""fp8_copies_made (checks.fp8_copies) on TE's own Linear under Float8BlockScaling over the tex emulation (sm90):
a weight whose input needs no gradient (a frozen first layer, and the trained layer after it) has no dgrad, so no
columnwise copy of it is needed. The clean run
(TE 2.20.2 makes none, and without biases no columnwise grad_output copy for the frozen layers: TE issue 1693's fix)
passes; a planted TE build keeping a columnwise copy of every weight fails naming the frozen layers; the per-recipe
copy sizes of the oracle match what TE allocates for the copies it keeps. A gradient copy no backward GEMM reads (so
of no layer known) is judged too: GroupedLinear's unread columnwise grad_output copies are named. Under
CustomRecipe(high_precision_fwd_mxfp8_bwd) at sm100 (tests/custom_recipe_moe.py, its own interpreter) a run where
nothing needs a gradient quantizes nothing and passes saying so, while a build making columnwise copies there fails
and a record that missed the GEMMs or the copies stays not observed; te_saved_bytes names GroupedLinear's saved bias
casts (no FP8 copy, no layer input), and without biases the saved bytes are exact."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.fp8_copies import copies_made, fp8_copies
from te_verify.matrix.te import MOE_ROWS, MOE_WIDTHS, block_spec
from te_verify.oracle.copy_bytes import layout_bytes
from te_verify.run import te_case
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec, TEConfig
from te_verify.te import api as te_api

ROOT = Path(__file__).resolve().parents[1]
ALT = (True, False, True, False)  # layers 0 and 2 frozen
SPEC = CaseSpec("te_peft", (32, 64, 128, 64, 32), ALT, None, False, (16,), te=TEConfig(recipe="block"))


class _Case:
    """What te_case.te_probes reads of a case."""

    def __init__(self, spec: CaseSpec) -> None:
        self.spec, self.backend_name, self.backend = spec, "te_eager", TEEagerBackend()


@pytest.fixture(scope="module")
def emulated():
    impl = te_api.resolve("transformer_engine_cpu", "sm90")
    with te_api.using(impl):
        impl.api  # noqa: B018 -- boots TE's Python over the emulation
        yield impl


def _run(spec: CaseSpec):
    case = _Case(spec)
    return run_mean_reduced(spec, case.backend, te_case.te_probes(case))


class ColumnwiseWeightCopies:
    """Planted TE build: every weight (a Parameter) is quantized with a columnwise copy, needed or not (TE PR 3233's
    waste, for any weight)."""

    def __enter__(self) -> "ColumnwiseWeightCopies":
        import torch

        self.tex = sys.modules["transformer_engine_torch"]
        self.original = self.tex.quantize

        def quantize(tensor, quantizer, *args, **kwargs):
            if isinstance(tensor, torch.nn.Parameter):
                quantizer.set_usage(rowwise=True, columnwise=True)
            return self.original(tensor, quantizer, *args, **kwargs)
        self.tex.quantize = quantize
        return self

    def __exit__(self, *exc) -> None:
        self.tex.quantize = self.original


def test_clean_block_run_makes_no_unneeded_columnwise_copy(emulated):
    got = _run(SPEC)
    verdict = copies_made(SPEC.id, "te_eager", SPEC, got)
    assert verdict.ok, verdict.message
    made = verdict.figures["fp8_copies_made"]
    assert verdict.figures["fp8_copies_made_compared"] >= 8
    assert "columnwise" not in made["0/weight"]["layouts"]  # frozen, its input needs no gradient
    assert made["2/grad_output"]["layouts"].keys() == {"rowwise"}  # frozen, no bias: TE 1693's fix
    assert made["2/weight"]["layouts"]["columnwise"] == layout_bytes("block", "weight", 64, 128, "columnwise")
    assert made["3/input"]["layouts"]["columnwise"] == layout_bytes("block", "input", 16, 64, "columnwise")


def test_planted_columnwise_weight_copy_fails_naming_the_frozen_layers(emulated):
    with ColumnwiseWeightCopies():
        got = _run(SPEC)
    verdict = copies_made(SPEC.id, "te_eager", SPEC, got)
    assert not verdict.ok
    assert "layer 0: weight has a columnwise copy" in verdict.message
    assert "(dgrad not needed" in verdict.message
    assert "layer 1: weight has a columnwise copy" in verdict.message  # trained, but its input needs no gradient
    assert not any("layer 2" in p or "layer 3" in p for p in verdict.problems), verdict.problems


def test_saved_copies_are_sized_per_recipe(emulated):
    """fp8_copies holds the saved input copies (wgrad needed: layers 1 and 3) to the block format's columnwise
    layout (data and its padded fp32 scales): none is named. TE also keeps the rowwise weight data beside the
    columnwise copy dgrad reads (TE PR 1770, recorded): exactly one more layout of the 128x128-tiled weight."""
    got = _run(SPEC)
    verdict = fp8_copies(SPEC.id, "te_eager", SPEC, got)
    assert verdict.figures["fp8_copies_compared"] == 8
    assert "input FP8 copy" not in verdict.message, verdict.message
    column = layout_bytes("block", "weight", 64, 128, "columnwise")
    both = column + layout_bytes("block", "weight", 64, 128, "rowwise")
    assert f"layer 2: saved weight FP8 copy: {both:,} B in 4 buffers, {column:,} B required" in verdict.message


def _moe(frozen_experts: tuple[int, ...]) -> CaseSpec:
    """te_moe's block-scaled case: one GroupedLinear of 4 experts with biases, its input needing no gradient."""
    return block_spec("te_moe", "block", MOE_WIDTHS, (False,), (False,), False,
                      te=dict(module="grouped_linear", experts=4, frozen_experts=frozen_experts), batch_shape=MOE_ROWS)


def test_unread_grad_output_copy_is_named_though_no_gemm_attributes_it(emulated):
    """Experts 0 and 2 frozen: TE (expert-0 rule) runs no wgrad and, the input needing none, no dgrad, yet
    quantizes grad_output in both layouts for the bias gradient: the columnwise copy no GEMM reads is named."""
    spec = _moe((0, 2))
    verdict = copies_made(spec.id, "te_eager", spec, _run(spec))
    assert not verdict.ok
    want = layout_bytes("block", "grad_output", 16, 32, "columnwise")  # one expert's 16 rows
    assert f"layer ?: grad_output has a columnwise copy ({want:,} B) that no GEMM reads" in verdict.message
    assert verdict.figures["fp8_copies_made"]["?/grad_output"]["read_by"] == []


def test_grad_output_copies_the_wgrads_read_pass(emulated):
    """The clean twin: every expert trains, so each wgrad reads its grad_output's columnwise copy (attributed)."""
    spec = _moe(())
    verdict = copies_made(spec.id, "te_eager", spec, _run(spec))
    assert verdict.ok, verdict.message
    made = verdict.figures["fp8_copies_made"]
    assert "?/grad_output" not in made
    assert all("wgrad:columnwise" in made[f"0.e{i}/grad_output"]["read_by"] for i in range(4))


@pytest.fixture(scope="module")
def custom_sm100() -> dict:
    """tests/custom_recipe_moe.py's verdicts, from an interpreter booted at sm100."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "custom_recipe_moe.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.system  # custom_sm100: an interpreter booted at sm100
def test_nothing_quantized_where_nothing_needs_a_gradient_passes_saying_so(custom_sm100):
    """Every expert and the input frozen: CustomRecipe's high-precision forward makes no copy, and none is needed."""
    clean = custom_sm100["made clean"]
    assert clean["ok"], clean["message"]
    assert clean["figures"]["fp8_copies_made_compared"] == ("nothing: no quantized copy made, and the 4 GEMMs "
                                                            "recorded read high-precision operands")


@pytest.mark.system  # custom_sm100: an interpreter booted at sm100
def test_planted_columnwise_copies_where_nothing_needs_them_fail(custom_sm100):
    planted = custom_sm100["made planted"]
    assert not planted["ok"]
    for expert in range(4):
        assert f"layer 0.e{expert}: weight has a columnwise copy" in planted["message"]


@pytest.mark.system  # custom_sm100: an interpreter booted at sm100
@pytest.mark.parametrize("run", ["made no gemms", "made fp8 gemms", "made unattributed gemms", "made trains"])
def test_a_record_that_missed_the_gemms_or_the_copies_is_not_observed(custom_sm100, run: str):
    """No GEMM seen, GEMMs on FP8 operands or of no layer beside no copy, or no copy where wgrads needed some."""
    verdict = custom_sm100[run]
    assert not verdict["ok"]
    assert "fp8_copies_made not observed: no quantized copy attributed to a layer" in verdict["message"]


@pytest.mark.system  # custom_sm100: an interpreter booted at sm100
def test_saved_bias_casts_are_named_and_without_biases_saved_bytes_are_exact(custom_sm100):
    """GroupedLinear keeps a bf16 cast of each expert's bias (fp32 activations, FP8 GEMMs) that backward never
    reads: te_saved_bytes fails by exactly those 4 x 64 B and names them; without biases it passes."""
    with_bias, without = custom_sm100["saved bias"], custom_sm100["saved nobias"]
    assert not with_bias["ok"]
    assert with_bias["figures"]["saved_bytes_actual"] - with_bias["figures"]["saved_bytes_required"] == 4 * 32 * 2
    assert "saved storages no FP8 copy or layer input accounts for: 4 x bfloat16[32] (256 B)" in with_bias["message"]
    assert without["ok"], without["message"]
    assert without["figures"]["saved_bytes_actual"] == without["figures"]["saved_bytes_required"] > 0
