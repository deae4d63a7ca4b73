"""Pure policy, no I/O and no torch: graph boundaries, when to compile, job priorities."""
