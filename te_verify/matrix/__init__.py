"""Case generators by lane and family group (stacks, te, models, dist, engines), the tiers and shapes they share,
and what chooses and orders what they generate (selection: the pr tier's pairwise choice; shard; case_order)."""
