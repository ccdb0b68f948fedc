"""Required work: what a case needs (GEMMs by site and role, saved tensors, a peak bound), from the spec's masks
(required), a model's fx graph (graph) or its torch.export graph (export), over its linear sites (sites)."""
