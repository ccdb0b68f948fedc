"""The distributed lane: a persistent rank pool, wrappers, the in-rank case runner and the torchrun entry."""
