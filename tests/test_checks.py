"""The standard checks catch each planted fault with a message naming case, backend, parameter, figures."""
from __future__ import annotations

import pytest

from planted_backends import DropsGrad, GradForFrozen, OffByOnePercent, RaisesOnReplay, ReplayDiverges
from te_verify.backends.eager import EagerBackend
from te_verify.backends.registry import resolve_backend
from te_verify.run.caserun import CaseRun
from te_verify.spec import CaseSpec

ALT = (True, False, True, False)
SPEC = CaseSpec("freeze", (32, 64, 128, 64, 32), ALT, ALT, True, (4, 6), "fp32", 1)
REPLAY = SPEC.replace(family="replay", replays=3)


def failure(spec: CaseSpec, backend) -> str:
    with pytest.raises(AssertionError) as info:
        CaseRun(spec, backend.name, backend).verify()
    return str(info.value)


@pytest.mark.parametrize("name", ["eager", "thunder", "torch_compile"])
@pytest.mark.parametrize("spec", [SPEC, REPLAY], ids=["r1", "r3"])
def test_clean_backends_pass(name, spec):
    backend = resolve_backend(name)
    CaseRun(spec, backend.name, backend).verify()


def test_off_by_one_percent_names_parameter_errors_and_tolerance():
    message = failure(SPEC, OffByOnePercent())
    assert SPEC.id in message and "planted_off_by_1pct" in message
    assert "grad of 1.weight: error vs the fp64 truth 0.01 (normwise, relative)" in message and "max abs err" in message
    assert "exceeds 2 x max(eager's" in message  # the bound: a factor of eager's own error vs fp64
    assert "0.weight" not in message and "3.weight" not in message  # only the faulty layer is named


def test_gradient_for_frozen_weight_is_caught():
    message = failure(SPEC, GradForFrozen())
    assert "0.weight: has a gradient after pass 1, expected None" in message


def test_dropped_gradient_of_trainable_weight_is_caught():
    message = failure(SPEC, DropsGrad())
    assert "1.weight: gradient is None after pass 1, expected a gradient" in message


def test_replay_that_diverges_names_the_replay_and_parameter():
    message = failure(REPLAY, ReplayDiverges())
    assert "after backward pass 2" in message and "grad of 1.weight" in message
    assert "after backward pass 1" not in message


def test_raise_where_eager_completes_is_caught():
    message = failure(REPLAY, RaisesOnReplay())
    assert "raised RuntimeError at backward pass 2" in message and "eager completed 3 backward pass(es)" in message


def test_same_exception_class_at_same_pass_passes():
    """Where eager itself raises, a backend raising the same class at the same pass is conformant."""
    frozen_all = SPEC.replace(weight_frozen=(True,) * 4, bias_frozen=(True,) * 4, input_requires_grad=False)
    eager = CaseRun(frozen_all, "eager", EagerBackend())
    assert eager.run().error_pass == 1  # nothing requires grad: backward raises in eager too
    CaseRun(frozen_all, "thunder", resolve_backend("thunder")).verify()


def test_per_rank_checks_observe_nothing_when_no_rank_completed():
    """Ranks that all raised (thunder's wrappers where thunder does not import) leave dist_output_parity and
    dist_state_left_behind nothing to compare: not observed, blamed on dist_grad_parity, never a pass; one rank
    that completed is compared."""
    import torch

    from te_verify.checks.dist_parity import dist_output_parity, dist_state_left_behind
    from te_verify.checks.tolerances import Tolerance
    from te_verify.record import Record

    tol = Tolerance(1e-6, 1e-6, "test")
    ref = Record("eager", output=torch.ones(2), grads=[{"w": torch.ones(2)}])
    dead = [Record("thunder_ddp", error=ImportError("thunder failed to import")) for _ in range(2)]
    for check in (dist_output_parity, dist_state_left_behind):
        verdict = check("c", "thunder_ddp", ref, dead, tol)
        assert not verdict.ok and "not observed: none of the 2 ranks completed" in verdict.message
        assert verdict.blocked_by == "dist_grad_parity"
    alive = Record("ddp", output=torch.ones(2), grads=[{"w": torch.ones(2)}])
    assert dist_output_parity("c", "ddp", ref, [alive, dead[0]], tol).ok
