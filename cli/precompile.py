"""`trnsim precompile MANIFEST...`: compile ahead, through the host's daemon, every graph a
run recorded (NEURON_RECORD_GRAPHS), so that the next run finds them in the cache: per-op
executables, adaptive mode's fused graphs, compiled regions and shape buckets alike.

Manifests merge (a graph is compiled once, by its cache key). What the cache already holds
is looked up first (one Lookup call, no compile); the rest goes over one Compile stream,
`jobs` requests in flight, compiled in parallel by the daemon's worker pool.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from trnsim import compiler
from trnsim.compiler import manifest
from trnsim.daemon import launcher
from trnsim.daemon.options import config_from
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc

LOOKUP_BATCH = 5_000  # keys per Lookup (presence only: small answers; the daemon takes 10,000)
MAX_MESSAGE_BYTES = 512 * 1024 * 1024  # the daemon's own send limit


@dataclass
class Summary:
    graphs: int = 0
    cached: int = 0
    compiled: int = 0
    failed: int = 0
    modelled_seconds: float = 0.0  # the chip compiler's time for what was compiled now
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            (
                f"{self.graphs} graphs: {self.compiled} compiled, {self.cached} already cached, "
                f"{self.failed} failed; {self.modelled_seconds:.1f} s of modelled compile time "
                f"compiled ahead, in {self.seconds:.1f} s"
            )
        ]
        out += [f"  failed: {e}" for e in self.errors[:10]]
        if len(self.errors) > 10:
            out.append(f"  ... and {len(self.errors) - 10} more")
        return out


def load(paths: list[Path]) -> dict[str, svc.CompileRequest]:
    requests: dict[str, svc.CompileRequest] = {}
    for path in paths:
        for key, r in manifest.read(path).items():
            requests.setdefault(key, r)
    return requests


def run(requests: dict[str, svc.CompileRequest], address: str, jobs: int) -> Summary:
    """Compiles what the daemon at address does not hold yet; a progress bar on stderr."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    start = time.monotonic()
    summary = Summary(graphs=len(requests))
    version, fmt = compiler.compiler_version(), compiler.FORMAT_VERSION
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = svc_grpc.CompileServiceStub(channel)
        keys = sorted(requests)
        missing: list[str] = []
        for i in range(0, len(keys), LOOKUP_BATCH):
            batch = keys[i : i + LOOKUP_BATCH]
            answer = stub.Lookup(
                svc.LookupRequest(
                    cache_keys=batch,
                    compiler_version=version,
                    format_version=fmt,
                    presence_only=True,
                ),
                timeout=60,
            )
            found = {e.cache_key for e in answer.entries if e.found}
            summary.cached += len(found)
            missing += [k for k in batch if k not in found]
        bar = tqdm(
            total=len(keys), initial=summary.cached, unit="graph", file=sys.stderr, disable=None
        )
        slots = threading.Semaphore(max(1, jobs))
        names = {}

        def stream() -> Iterator[svc.CompileRequest]:
            for n, key in enumerate(missing, 1):
                slots.acquire()
                r = svc.CompileRequest()
                r.CopyFrom(requests[key])
                r.id, r.priority = n, svc.BLOCKING  # a user waits for these
                r.compiler_version, r.format_version = version, fmt
                names[n] = r.debug.name or key[:12]
                yield r

        if missing:
            for result in stub.Compile(stream()):
                slots.release()
                bar.update(1)
                if result.WhichOneof("outcome") == "error":
                    summary.failed += 1
                    summary.errors.append(f"{names.get(result.id)}: {result.error.message}")
                elif result.tier in (svc.MEMORY, svc.DISK, svc.REMOTE):
                    summary.cached += 1
                else:
                    summary.compiled += 1
                    summary.modelled_seconds += result.modelled_compile_seconds
                if summary.cached + summary.compiled + summary.failed == len(keys):
                    break
        bar.close()
    summary.seconds = time.monotonic() - start
    return summary


def cmd_precompile(args: argparse.Namespace) -> int:
    try:
        requests = load([Path(p) for p in args.manifests])
    except (OSError, manifest.ManifestError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = config_from(args)
    if launcher.ensure_daemon(config.address) is None:
        print(
            f"error: no daemon answers on {config.address}; start one with trnsim daemon start",
            file=sys.stderr,
        )
        return 1
    info = launcher.get_info(
        config.address, version=compiler.compiler_version(), fmt=compiler.FORMAT_VERSION
    )
    if info is not None and not info.compatible:
        print(
            f"error: the daemon on {config.address} (pid {info.pid}) runs compiler "
            f"{info.compiler_version}, this install {compiler.compiler_version()}: its cache "
            f"would serve no run of this install. Stop it (trnsim daemon stop) and run "
            f"precompile again: it starts a current one.",
            file=sys.stderr,
        )
        return 1
    try:
        summary = run(requests, config.address, args.jobs)
    except grpc.RpcError as e:
        print(f"error: the daemon on {config.address} failed: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    print("\n".join(summary.lines()))
    return 1 if summary.failed else 0
