"""The per-host compilation daemon: gRPC over a Unix socket, dedupe, worker pool, caches."""
