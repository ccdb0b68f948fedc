"""The weight-gradient return contract as data: module kind x config -> what backward returns for a weight.

Source: the table in TE PR 2871's review (seed 002). "intended" is the behaviour the suite checks for;
TE's GroupedLinear op is observed to return None where the others return the dummy (delayed wgrad with
main_grad and grad_added_to_main_grad), kept as a separate labelled row.
"""
from __future__ import annotations

from dataclasses import dataclass

from te_verify.spec import TEConfig

KINDS = ("linear", "grouped_linear", "ops_linear", "ops_grouped_linear", "grouped_mlp")
CONFIGS = ("vanilla", "delay", "main_grad", "main_grad+added", "delay+main_grad", "delay+main_grad+added")
RETURNS = ("wgrad", "none", "dummy")

_INTENDED_BY_CONFIG = {
    "vanilla": "wgrad",
    "delay": "none",
    "main_grad": "none",
    "main_grad+added": "dummy",
    "delay+main_grad": "none",
    "delay+main_grad+added": "dummy",
}


@dataclass(frozen=True)
class ContractRow:
    """One cell of the table."""

    # Module kind, one of KINDS.
    kind: str
    # Config, one of CONFIGS.
    config: str
    # What backward returns for the weight: "wgrad", "none" or "dummy".
    returns: str
    # "intended" or "observed: <who> (<source>)".
    label: str


INTENDED: dict[tuple[str, str], ContractRow] = {
    (kind, config): ContractRow(kind, config, ret, "intended")
    for kind in KINDS for config, ret in _INTENDED_BY_CONFIG.items()
}

# Where TE's code is observed to differ from the intended row (seed 002, review of TE PR 2871).
OBSERVED_TE: dict[tuple[str, str], ContractRow] = {
    ("grouped_linear", "delay+main_grad+added"): ContractRow(
        "grouped_linear", "delay+main_grad+added", "none",
        "observed: TE ops.GroupedLinear (TE PR 2871 review; ops/basic/grouped_linear.py)"),
}

VARIANTS = ("intended", "observed_te")


def config_name(delay: bool, main_grad: bool, added: bool) -> str:
    """The CONFIGS name of a combination of delay_wgrad, fuse_wgrad_accumulation and grad_added_to_main_grad."""
    parts = (["delay"] if delay else []) + (["main_grad"] if main_grad else []) + (["added"] if added and main_grad else [])
    return "+".join(parts) if parts else "vanilla"


def config_of(te: TEConfig) -> str:
    return config_name(te.delay_wgrad, te.main_grad, te.grad_added_to_main_grad)


def row(kind: str, config: str, variant: str = "intended") -> ContractRow:
    """The contract row; variant "observed_te" returns TE's observed row where it differs."""
    if variant == "observed_te" and (kind, config) in OBSERVED_TE:
        return OBSERVED_TE[(kind, config)]
    return INTENDED[(kind, config)]


def table(variant: str = "intended") -> list[ContractRow]:
    return [row(kind, config, variant) for kind in KINDS for config in CONFIGS]
