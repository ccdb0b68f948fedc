"""Deprecated: what this module held moved (TrainStep, StateBytes, sgd: te_verify.api; the engines' helpers:
te_verify.distributed.rank.training). Its names still import, with a warning, for one release (te_verify.moved,
docs/api.md)."""
from te_verify import moved

__getattr__ = moved.module_getattr(__name__)
