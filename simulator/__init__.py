"""The simulated Trainium chip: targets, HBM allocator, cost model and device timeline."""
