"""What activation recompute (CaseSpec.recompute) requires: which forward GEMMs each backward pass may run again, and
which tensors the forward keeps instead of the checkpointed layers' inputs.

A checkpointed block (models.recompute: pairs of the stack's layers, each Llama block) is a region. Its backward
runs iff a gradient flows in it (one of its sites has a backward role); a region with nothing needing a gradient
inside or before it recomputes nothing and keeps nothing. Where its backward runs, every backward pass (each replay)
runs the region's forward again from its saved inputs, once: every site's fprop GEMM at most once more per pass
(reentrant checkpointing reruns the whole region, its backward starting from the recomputed outputs). Less is no
fault (checks.waste: a note): torch's non-reentrant early stop ends the rerun once the last tensor the backward reads
is back (aten ops save their operands before their GEMM runs, so the last saving linear's GEMM is skipped; a custom
autograd.Function saves after, so it is not), and torch.compile's partitioner recomputes only the outputs its
backward reads. What a backend did not recompute it must have kept, which the saved check judges against the rule
below, and a recompute short of what backward reads would show in the gradients.
Never a wgrad for a frozen weight: the recompute changes the forward work only (required.backward_gemms adds it).
Saved for backward: each region's input (its first site's input), a new allocation unless it is the model input,
instead of the inputs of the sites inside it; sites outside every region save as without recompute.
"""
from __future__ import annotations

from te_verify.models.recompute import regions
from te_verify.oracle.sites import Site
from te_verify.spec import CaseSpec

def site_regions(spec: CaseSpec, all_sites: list[Site]) -> list[list[Site]]:
    """The checkpointed regions as lists of sites in forward order (empty without recompute)."""
    if spec.recompute == "none":
        return []
    if spec.model is None:
        return [[s for s in all_sites if s.layer in block] for block in regions(spec.n_layers)]
    return [[s for s in all_sites if s.label.startswith(f"blocks.{b}.")] for b in range(spec.model.blocks)]


def runs_backward(region: list[Site]) -> bool:
    return any(s.roles() for s in region)


def recomputed_sites(spec: CaseSpec, all_sites: list[Site]) -> list[Site]:
    """The sites whose fprop GEMM every backward pass may run again (at most once each)."""
    return [s for region in filter(runs_backward, site_regions(spec, all_sites)) for s in region]


def working_elements(spec: CaseSpec, all_sites: list[Site]) -> int:
    """Elements a recompute holds while one region's backward runs: the outputs of its recomputed sites (the inputs
    of the sites after them, saved by the recomputed graph, and the region's output, a reentrant backward's root),
    the largest region's. The peak bound adds them: the forward did not keep them, the backward makes them again."""
    recomputed = {s.label for s in recomputed_sites(spec, all_sites)}
    return max((sum(s.rows * s.fan_out for s in region if s.label in recomputed)
                for region in site_regions(spec, all_sites)), default=0)


def recomputed_labels(spec: CaseSpec, all_sites: list[Site]) -> set[str]:
    """Labels of every site inside a checkpointed region (their inputs are recomputed, not saved)."""
    return {s.label for region in site_regions(spec, all_sites) for s in region}


def checkpoint_inputs(spec: CaseSpec, all_sites: list[Site]) -> list[Site]:
    """The first site of each region whose backward runs: its input is what the forward keeps for the region. A
    model family's region input is the block's input, which is not a site's: its families' check reads it as
    'outside sites' (checks.family_waste)."""
    return [region[0] for region in filter(runs_backward, site_regions(spec, all_sites))]
