"""Known gaps as data (expectations/*.toml): loading entries (entries), judging a case check by check against the
ones that cover it (judge), and rewriting them from a run (update)."""
