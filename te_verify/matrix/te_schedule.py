"""Case generators for freeze schedules in the TE lane (family te_schedule, CaseSpec.schedule over TE modules).

The trainable set of a TE stack changes between iterations as the torch lane's `schedule` family changes it
(matrix.stacks.schedule_specs), on the TE stacks te_peft and te_fp8 run: TE's Linear and te.ops' fused Linear (whose
Sequential resets its FP8 recipe state when the first op needing backward changes), high precision and FP8 with
delayed and current scaling; nightly adds a short amax history rolling across the changes (delayed scaling's history
judged by fp8_scaling after each change). Every iteration trains something: a step with nothing to train raises in
eager too and would end the run before the change.
"""
from __future__ import annotations

from te_verify.matrix.te import NON_SQUARE4, RECIPES
from te_verify.matrix.tiers import check_tier, dedupe, named_masks
from te_verify.spec import SCHEDULE_TE_MODULES, CaseSpec, TEConfig

FAMILY = "te_schedule"
# (masks at iteration 1, schedule): a frozen backbone unfrozen after warm-up; everything frozen but the head after it;
# a LoRA-style phase switch then BitFit; a later switch.
PLANS = {"unfreeze": ("prefix", ((2, "unfreeze_all"),)), "head": ("none", ((2, "freeze_all_but_last"),)),
         "swap_bitfit": ("alternating", ((2, "swap"), (3, "bias_only"))), "late_swap": ("suffix", ((3, "swap"),))}
# The pr candidates (matrix.selection draws from them pairwise): each recipe, each module and each change once.
PR = (("unfreeze", "delayed", "linear", False), ("head", "delayed", "ops_linear", True),
      ("swap_bitfit", "current", "linear", True), ("unfreeze", None, "ops_linear", False))
# Delayed scaling's amax history shorter than the run (matrix.te.HISTORY_LEN's idea): both changes' iterations roll it.
HISTORY_LEN, HISTORY_ITERATIONS = 2, 4


def schedule_case(plan: str, recipe: str | None, module: str, x_grad: bool, **te) -> CaseSpec:
    """The non-square stack under `plan` (PLANS) on TE `module` with `recipe`, the layers' biases masked with them."""
    mask = named_masks(4)[PLANS[plan][0]]
    iterations = HISTORY_ITERATIONS if te.get("amax_history_len") else 3
    return CaseSpec(FAMILY, NON_SQUARE4, mask, mask, x_grad, (16,), te=TEConfig(recipe=recipe, module=module, **te),
                    iterations=iterations, schedule=PLANS[plan][1])


def te_schedule_specs(tier: str) -> list[CaseSpec]:
    """smoke: one FP8 unfreeze; pr: PR's candidates; nightly: every plan x recipe x module x input-gradient need, and
    delayed scaling with a short history across two changes (E4M3 and HYBRID)."""
    check_tier(tier)
    specs = [schedule_case(*case) for case in PR]
    if tier == "smoke":
        return specs[:1]
    if tier == "nightly":
        specs += [schedule_case(plan, recipe, module, x) for plan in PLANS for recipe in (None, *RECIPES)
                  for module in SCHEDULE_TE_MODULES for x in (False, True)]
        specs += [schedule_case("swap_bitfit", "delayed", module, True, amax_history_len=HISTORY_LEN, fp8_format=f)
                  for module in SCHEDULE_TE_MODULES for f in ("E4M3", "HYBRID")]
    return dedupe(specs)
