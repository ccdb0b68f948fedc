"""The persistent rank pool (pool), the process each rank runs (worker), and the pytest fixtures that own a pool
per xdist worker (fixtures)."""
