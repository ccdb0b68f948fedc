"""Case specs: what to build and how to run it. Frozen and hashable; no behaviour beyond naming.

A spec names a stack of linear layers (widths, which weights and biases are frozen), the input, the
dtype, how many backward replays to run, when freezing happens relative to the backend preparing the
model, and optionally a TE configuration and a distributed configuration.

One module per job, every name importable from here: the allowed values (values.py), the spec's parts (parts.py:
TEConfig, DistConfig, ModelConfig), CaseSpec itself (case.py), and the rules it is validated by (rules.py, whose
validate runs model_rules.py's too; error.py: SpecError).
"""
from __future__ import annotations

from te_verify.spec.case import CaseSpec
from te_verify.spec.error import SpecError
from te_verify.spec.model_rules import RECOMPUTE_WRAPPERS, SCHEDULE_TE_MODULES
from te_verify.spec.parts import DistConfig, ModelConfig, TEConfig
from te_verify.spec.rules import ACCUMULATING_WRAPPERS, validate
from te_verify.spec.values import (ACCUMULATIONS, AUTOCASTS, BLOCK_GROUPS, CUSTOM_FACTORIES, DTYPES,
                                   ENGINE_RECOMPUTE_MODES, FP8_FORMATS, FREEZE_TIMINGS, ITERATIONS,
                                   MIXED_PRECISION_DTYPES, MIXED_PRECISION_WRAPPERS, MLP_ACTIVATIONS, MLP_MODULES,
                                   MODEL_KINDS, NORM_MODULES, PROJECTIONS, RECIPES, RECOMPUTE_MODES, REENTRANT_MODES,
                                   SCHEDULE_CHANGES, SCHEDULE_KINDS, STAGES, TE_MODULES, TE_RECOMPUTE_MODES,
                                   USER_WRAPPERS, WRAPPERS, KindRules)
