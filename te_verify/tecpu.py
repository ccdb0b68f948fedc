"""Deprecated alias of te_verify.te.tecpu (TE's Python over the tex emulation), kept for one release
(te_verify.moved, docs/api.md)."""
from te_verify import moved

moved.alias(__name__)
