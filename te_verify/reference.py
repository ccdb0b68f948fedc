"""Deprecated alias of te_verify.te.reference (`--te-impl te_verify.reference`), kept for one release
(te_verify.moved, docs/api.md)."""
from te_verify import moved

moved.alias(__name__)
