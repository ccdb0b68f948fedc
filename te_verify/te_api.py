"""Deprecated alias of te_verify.te.api (the TE build API; its public part is in te_verify.api), kept for one
release (te_verify.moved, docs/api.md)."""
from te_verify import moved

moved.alias(__name__)
