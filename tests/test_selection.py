"""The pr tier chosen by pairwise cover (te_verify.matrix.selection): every pair of factor values of each family x backend
is covered, the cases left out run in nightly, the choice is deterministic, and the cost weighs it."""
from __future__ import annotations

from pathlib import Path

import pytest

from te_verify.report.summary import selection_lines
from te_verify.matrix.selection import choose, factors, mask_class, measured_costs, required_pairs, select_pr
from te_verify.spec import CaseSpec
from loading import load_file

CASES = Path(__file__).resolve().parents[1] / "cases"


def _families() -> list:
    modules = []
    for path in sorted(CASES.glob("test_*.py")):
        module = load_file(path, f"cases_{path.stem}")
        if hasattr(module, "SPECS") and getattr(module, "FAMILY", "") != "generated":
            modules.append(module)
    return modules


def test_mask_classes():
    assert [mask_class(m) for m in [(False,) * 4, (True,) * 4, (True, False, True, False), (True, True, False, False),
                                    (False, False, True, True), (False, True, False, False), None]] == [
        "none", "all", "alternating", "prefix", "suffix", "other-1", "absent"]


@pytest.mark.parametrize("module", _families(), ids=lambda m: m.FAMILY)
def test_the_choice_covers_every_pair_of_its_family_and_is_in_nightly(module):
    candidates = module.SPECS("pr")
    nightly = {s.id for s in module.SPECS("nightly")}
    groups = {None: candidates} if module.LANE != "dist" else {
        w: [s for s in candidates if s.dist.wrapper == w] for w in {s.dist.wrapper for s in candidates}}
    for backend, group in groups.items():
        chosen, kept = select_pr(module.FAMILY, str(backend or "eager"), group)
        wanted = required_pairs([factors(s) for s in group])
        covered = required_pairs([factors(s) for s in chosen]) if len(chosen) > 1 else set()
        missing = {p for p in wanted if not any(all(factors(s).get(k) == v for k, v in p) for s in chosen)}
        assert not missing, f"{module.FAMILY}/{backend}: pairs not covered: {sorted(missing)[:3]}"
        assert kept["chosen"] == len(chosen) >= 1 and covered <= wanted | covered
        assert chosen == select_pr(module.FAMILY, str(backend or "eager"), group)[0]  # deterministic
        left_out = {s.id for s in group} - {s.id for s in chosen}
        assert left_out <= nightly, f"{module.FAMILY}: pr cases the nightly tier lacks: {sorted(left_out - nightly)[:3]}"


def test_cost_weighs_the_choice():
    base = CaseSpec("freeze", (8, 8, 8), (False, False), None)
    specs = [base, base.replace(dtype="bf16"), base.replace(input_requires_grad=True),
             base.replace(dtype="bf16", input_requires_grad=True)]
    cheap_pair, _ = choose([s.id for s in specs], specs, [1.0, 1.0, 1.0, 100.0])
    dear_pair, _ = choose([s.id for s in specs], specs, [100.0, 1.0, 1.0, 1.0])
    assert 3 in cheap_pair and 0 in dear_pair  # each pair has one case that covers it: those must stay
    assert len(choose([s.id for s in specs[:1]], specs[:1], [1.0])[0]) == 1  # nothing varies: one case stands



def test_the_measured_costs_are_read():
    """The committed cost table is found (te_verify/data/pr_costs.json): without it every case costs the same and the
    pr tier chooses other cases."""
    assert len(measured_costs()) > 100


def test_the_summary_counts_chosen_cases_that_skipped():
    """A chosen case that skips (a budget skip on thunder) covers none of its pairs: the summary says how many."""
    kept = {"chosen": 2, "candidates": 4, "pairs": 9, "seconds": 1.0}
    rows = [{"family": "hf_peft", "backend": "thunder", "selection": kept, "outcome": outcome}
            for outcome in ("passed", "skipped")]
    lines = selection_lines(rows)
    assert "1 of them skipped" in lines[1]
    assert "| hf_peft | thunder | 2 / 4 | 9 | 1 | 1.0 |" in lines
