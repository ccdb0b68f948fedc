"""What an invalid spec raises (SpecError), and `_check`, the one way the rules raise it."""
from __future__ import annotations


class SpecError(ValueError):
    """An invalid spec; the message names the field and the value."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise SpecError(what)
