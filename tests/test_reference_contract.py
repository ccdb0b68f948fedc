"""The contract table as data, TE's observed GroupedLinear row, and the grouped modules' numerics."""
import torch

from te_verify.te import api as te_api
from te_verify.backends.eager import EagerBackend
from te_verify.backends.te_eager import TEEagerBackend
from te_verify.checks.te_contract import return_contract
from te_verify.checks.tolerances import tolerance_for
from te_verify.te.reference import GroupedLinear, contract, grouped
from te_verify.run.microbatch import run_microbatches
from te_verify.spec import CaseSpec, TEConfig


def test_table_rows_from_seed_002():
    assert contract.row("linear", "vanilla").returns == "wgrad"
    assert contract.row("grouped_mlp", "delay+main_grad+added").returns == "dummy"
    observed = contract.row("grouped_linear", "delay+main_grad+added", "observed_te")
    assert observed.returns == "none" and observed.label.startswith("observed")
    assert len(contract.table()) == len(contract.KINDS) * len(contract.CONFIGS) == 30


class ObservedGroupedLinear(grouped.GroupedLinear):
    contract_variant = "observed_te"


def test_check_catches_te_observed_grouped_linear_row():
    spec = CaseSpec("te_contract", (16, 32, 16), (False, False), None, True, (16,),
                    te=TEConfig(None, "grouped_linear", True, True, True, 2))
    ref = run_microbatches(spec, EagerBackend())
    base = te_api.resolve("reference")
    api = type(base.api)(**{**vars(base.api), "GroupedLinear": ObservedGroupedLinear})
    with te_api.using(te_api.TEImpl("observed", te_api.EXTERNAL, "TE's observed row", "observed", lambda: api)):
        got = run_microbatches(spec, TEEagerBackend())
    verdict = return_contract(spec.id, "te_eager", spec, "grouped_linear", ref, got, tolerance_for(spec))
    assert not verdict.ok and "backward returned none after microbatch 1, contract says dummy" in verdict.message


def test_grouped_linear_matches_per_group_linear():
    torch.manual_seed(0)
    mod = GroupedLinear(3, 16, 8, name="g")
    x = torch.randn(12, 16, requires_grad=True)
    out = mod(x, [4, 5, 3])
    want = torch.cat([torch.nn.functional.linear(xi, getattr(mod, f"weight{i}"), getattr(mod, f"bias{i}"))
                      for i, xi in enumerate(torch.split(x, [4, 5, 3]))])
    torch.testing.assert_close(out, want)
