"""The TE lane under torch.autocast(bf16): a saved cast copy of a frozen weight (issue 34's must-show). A frozen
first layer whose bias trains, under an input that needs no gradient, has a backward (for its bias) and no dgrad, so
the bf16 cast of its weight is not needed. te_verify.te.reference keeps none (the clean twin: it casts and saves in
its own functional code, not TE's); the planted build keeping it (tests/planted_te_autocast.py) fails te_saved_bytes
by exactly that cast's bytes (a pure-PyTorch build's saved tensors are judged in total: no tex boundary to name them
at), its GEMMs still the required ones; TE 2.20.2 over the tex emulation keeps it as the planted build does
(linear.py:739 `wt_save = weightmat`, recorded in expectations/te_eager.toml for te_autocast), and there the check
names layer 0's weight."""
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_waste import gemm_work, saved_bytes
from te_verify.matrix.tiers import NON_SQUARE4
from te_verify.probes import default_probes
from te_verify.run.microbatch import run_mean_reduced
from te_verify.spec import CaseSpec, TEConfig
from te_verify.te import api as te_api

FROZEN_FIRST = CaseSpec("te_autocast", NON_SQUARE4, (True, False, False, False), (False,) * 4, False, (16,),
                        te=TEConfig(), autocast="bf16")
KEPT = "layer 0 (dgrad not needed): saved a torch.bfloat16 copy of its weight [64, 32] 4,096 B, 0 required"


def _verdicts(impl: str):
    with te_api.using(te_api.resolve(impl)):
        got = run_mean_reduced(FROZEN_FIRST, TEEagerBackend(), default_probes("te_eager", True))
    assert got.error is None, got.error
    return gemm_work(FROZEN_FIRST.id, "te_eager", FROZEN_FIRST, got), saved_bytes(FROZEN_FIRST.id, "te_eager",
                                                                                FROZEN_FIRST, got)


def test_keeping_no_cast_of_the_frozen_weight_passes():
    work, saved = _verdicts("reference")
    assert work.ok and saved.ok, work.message + saved.message
    assert saved.figures["saved_bytes_actual"] == saved.figures["saved_bytes_required"] > 0


def test_the_planted_build_keeping_the_frozen_weight_s_cast_fails_te_saved_bytes_by_its_bytes():
    work, saved = _verdicts("planted_te_autocast")
    assert work.ok, work.message
    assert not saved.ok, saved.message
    assert saved.figures["saved_bytes_actual"] - saved.figures["saved_bytes_required"] == 64 * 32 * 2  # bf16 [64, 32]


def test_te_keeping_the_frozen_weight_s_cast_fails_te_saved_bytes_naming_it():
    work, saved = _verdicts(te_api.CPU_CHOICE)
    assert work.ok, work.message
    assert not saved.ok and KEPT in saved.message, saved.message
