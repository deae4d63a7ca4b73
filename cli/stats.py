"""`trnsim stats`: the daemon's counters, as a table or as JSON."""

from __future__ import annotations

import argparse
import sys

import grpc
from google.protobuf import json_format
from trnsim.daemon.options import config_from
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc


def stats_of(address: str) -> svc.StatsResponse:
    with grpc.insecure_channel(address) as channel:
        return svc_grpc.CompileServiceStub(channel).Stats(svc.StatsRequest(), timeout=5)  # type: ignore[no-any-return]


def cmd_stats(args: argparse.Namespace) -> int:
    config = config_from(args)
    try:
        stats = stats_of(config.address)
    except grpc.RpcError:
        print(f"no daemon answers on {config.address}", file=sys.stderr)
        return 3
    if args.json:
        print(json_format.MessageToJson(stats, always_print_fields_with_no_presence=True))
        return 0
    print(format_stats(stats))
    return 0


def format_stats(s: svc.StatsResponse) -> str:
    hits = s.memory.hits + s.disk.hits + s.remote.hits
    asked = s.requests + s.lookups
    rows = [
        ("requests (stream / lookup)", f"{s.requests} / {s.lookups}"),
        (
            "hits: memory / disk / remote",
            (
                f"{s.memory.hits} / {s.disk.hits} / {s.remote.hits} "
                f"({100 * hits / max(1, asked):.1f} % of requests)"
            ),
        ),
        ("hits clients read from disk themselves", str(s.direct_hits)),
        ("compiles", f"{s.compiles} (joined in flight: {s.joins})"),
        ("failures", ", ".join(f"{k} {v}" for k, v in sorted(s.failures.items())) or "none"),
        ("corrupt entries dropped", str(s.corrupt_entries)),
        ("queue / in flight / waiters", f"{s.queue_depth} / {s.in_flight} / {s.waiters}"),
        (
            "workers: alive / configured (restarts)",
            f"{s.workers_alive} / {s.workers} ({s.worker_restarts})",
        ),
        (
            "compile seconds: total, p50, p99",
            f"{s.compile_seconds_total:.3f}, {s.compile_seconds_p50:.3f}, {s.compile_seconds_p99:.3f}",
        ),
        ("seconds saved by hits and joins", f"{s.seconds_saved:.3f}"),
        (
            "memory tier: entries, bytes, evictions",
            f"{s.memory.entries}, {s.memory.bytes}, {s.memory.evictions}",
        ),
        (
            "disk tier: entries, bytes, evictions",
            f"{s.disk.entries}, {s.disk.bytes}, {s.disk.evictions}"
            if not s.disk_tier_off
            else f"off: {s.disk_tier_off}",
        ),
        ("connected clients, uptime", f"{s.connected_clients}, {s.uptime_seconds:.0f} s"),
        ("dropped jobs (nobody waiting)", str(s.dropped_jobs)),
        ("disk tier errors (answered as misses)", str(s.disk_errors)),
        *remote_rows(s.remote),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def remote_rows(r: svc.RemoteStats) -> list[tuple[str, str]]:
    """The cluster tier's rows (docs/operations.md: The cluster tier)."""
    if not r.store:
        return [("remote tier", "none (NEURON_CACHE_REMOTE, or the daemon's --remote)")]
    rows = [
        ("remote tier", r.store + (f"  OFF: {r.off} (asked again every 5 s)" if r.off else "")),
        (
            "remote: hits / misses / joined / skipped while off",
            f"{r.hits} / {r.misses} / {r.joined} / {r.skipped}",
        ),
        (
            "remote: puts / errors / dropped",
            f"{r.puts} / {r.put_errors} / {r.puts_dropped}",
        ),
        (
            "remote: signature failures / refused",
            f"{r.signature_failures} (never served) / {r.refused}",
        ),
        (
            "remote: latency p50, p99; failed calls",
            f"{r.latency_p50_ms:.2f} ms, {r.latency_p99_ms:.2f} ms; {r.errors}",
        ),
    ]
    rows += [("remote: recent error", e) for e in r.recent_errors[-5:]]
    return rows
