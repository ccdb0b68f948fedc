"""TE's rewritten modules are cached on disk (te_verify.te.tecpu.rewrite_cache): a hit is the code and the rewrite
sites a miss gives, and anything the code depends on (the source, the recorded file name, the rules) changed is a
miss, never a stale hit."""
from __future__ import annotations

import pytest

from te_verify.te.tecpu import rewrite, rewrite_cache

SOURCE = b"import torch\n\ndef f(x):\n    return x.is_cuda and torch.cuda.current_device() == 0\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(rewrite_cache, "CACHE", tmp_path)
    return tmp_path


def _load(source: bytes = SOURCE, filename: str = "transformer_engine/x.py", rules: str = rewrite.RULES):
    """(code, sites, how often the rewriter ran) of one load."""
    calls, sites = [], []

    def rewriting(into):
        calls.append(filename)
        return rewrite.rewrite_source(source.decode(), filename, into)

    return rewrite_cache.load_or_rewrite(source, filename, rules, sites, rewriting), sites, len(calls)


def test_a_hit_is_what_the_miss_rewrote(cache):
    code, sites, ran = _load()
    again, sites_again, ran_again = _load()
    assert (ran, ran_again) == (1, 0) and again == code and sites_again == sites
    assert [rule for _, _, rule in sites] == ["R2 x.is_cuda", "R1 torch.cuda"]  # the rewriter's own record
    assert len(list(cache.iterdir())) == 1


@pytest.mark.parametrize("changed", [dict(source=SOURCE + b"# edited\n"), dict(filename="transformer_engine/y.py"),
                                     dict(rules="rules-of-another-rewriter")])
def test_whatever_the_code_depends_on_changed_is_a_miss(cache, changed):
    _load()
    _, _, ran = _load(**changed)
    assert ran == 1, f"a change of {sorted(changed)} was served the old rewrite"


def test_an_unreadable_entry_is_rewritten(cache):
    code, _, _ = _load()
    entry = next(cache.iterdir())
    entry.write_bytes(b"\x00 not marshal")
    again, _, ran = _load()
    assert ran == 1 and again == code


def test_without_a_cache_folder_every_load_rewrites(monkeypatch):
    monkeypatch.setattr(rewrite_cache, "CACHE", None)
    assert [_load()[2], _load()[2]] == [1, 1]
