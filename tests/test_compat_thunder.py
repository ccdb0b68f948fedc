"""thunder's import failure is reported by its cause on every attempt (thunder 0.2.6 on torch >= 2.14 raises at
import, lightning-thunder#2833; a second attempt then failed for the half-registered first one instead), and
thunder's wrappers skip with it."""
from __future__ import annotations

import importlib
import types

import pytest

from te_verify.compat import thunder as compat_thunder
from te_verify.distributed.wrappers import wrapper_unavailable


def test_a_failed_thunder_import_names_its_first_cause_every_time(monkeypatch):
    monkeypatch.setattr(compat_thunder, "_FAILURE", [])
    causes = iter([AttributeError("Function.apply has no __func__"), AttributeError("already registered")])

    def failing(name, *args, **kwargs):
        if name == "thunder":
            raise next(causes)
        return importlib.import_module(name, *args, **kwargs)

    # compat.thunder's own importlib only: everything else imports as usual
    monkeypatch.setattr(compat_thunder, "importlib", types.SimpleNamespace(import_module=failing))
    for _ in range(2):
        with pytest.raises(ImportError, match="AttributeError: Function.apply has no __func__"):
            compat_thunder.import_thunder()
    assert wrapper_unavailable("thunder_ddp") == "thunder failed to import: AttributeError: Function.apply has no __func__"
    assert wrapper_unavailable("ddp") is None
