"""Checkout-wide pytest settings. The te_verify plugin itself is registered as a pytest11 entry point.

Hypothesis runs derandomized under CI (CI=true), so a CI failure reproduces with the same examples locally:
`HYPOTHESIS_PROFILE=ci pytest ...`.
"""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
