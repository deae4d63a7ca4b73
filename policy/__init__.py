"""What adaptive and compiled mode decide, as pure functions (no I/O, no torch): where graphs
are cut, when to ask for a compile, the daemon's queue order, shape buckets."""
