"""The `trnsim` command: daemon serve|start|stop|status, stats, cache ls|verify|prune|clear,
precompile MANIFEST (compile ahead what runs recorded), profile FILE (a profile's table),
doctor (is this host ready), explain FILE (why: cuts, breaks), registry test|stats and
record (the shape registry), --version."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from google.protobuf import json_format
from trnsim import compiler
from trnsim.daemon import launcher
from trnsim.daemon.cache import ExecutableCache
from trnsim.daemon.config import (
    SYSTEM_SOCKET,
    ConfigError,
    DaemonConfig,
    default_address,
    default_cache_dir,
    system_cache_dir,
)
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc


def _config(args: argparse.Namespace) -> DaemonConfig:
    config = DaemonConfig()
    if args.system:
        config.system = True
        config.address = f"unix:{SYSTEM_SOCKET}"
        config.cache_dir = system_cache_dir()
    if args.address:
        config.address = args.address if ":" in args.address else f"unix:{args.address}"
    if getattr(args, "cache_dir", None):
        config.cache_dir = Path(args.cache_dir)
    if getattr(args, "workers", None):
        config.workers = args.workers
    if getattr(args, "idle_exit", None) is not None:
        config.idle_exit_s = args.idle_exit
    if getattr(args, "memory_cache_mb", None):
        config.memory_cache_bytes = args.memory_cache_mb * 1024 * 1024
    if getattr(args, "disk_cache_mb", None):
        config.disk_cache_bytes = args.disk_cache_mb * 1024 * 1024
    if getattr(args, "compile_timeout", None):
        config.compile_timeout_s = args.compile_timeout
    return config


def _stats(address: str) -> svc.StatsResponse:
    with grpc.insecure_channel(address) as channel:
        return svc_grpc.CompileServiceStub(channel).Stats(svc.StatsRequest(), timeout=5)  # type: ignore[no-any-return]


def cmd_serve(args: argparse.Namespace) -> int:
    from trnsim.daemon.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(_config(args))


def cmd_start(args: argparse.Namespace) -> int:
    config = _config(args)
    info = launcher.get_info(config.address)
    if info is not None:
        print(f"already running: pid {info.pid} on {config.address}")
        return 0
    info = launcher.ensure_daemon(config.address, idle_exit_s=config.idle_exit_s)
    if info is None:
        print(
            f"error: the daemon did not start on {config.address}; see daemon.log next to the socket",
            file=sys.stderr,
        )
        return 1
    print(f"started: pid {info.pid} on {config.address}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    config = _config(args)
    info = launcher.get_info(config.address)
    if info is None:
        print(f"no daemon answers on {config.address}")
        return 0
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline and launcher.get_info(config.address, timeout=0.3) is not None
    ):
        time.sleep(0.1)
    print(f"stopped pid {info.pid}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    config = _config(args)
    info = launcher.get_info(
        config.address, version=compiler.compiler_version(), fmt=compiler.FORMAT_VERSION
    )
    if info is None:
        print(f"not running (nothing answers on {config.address})")
        return 3
    state = "compatible" if info.compatible else "DIFFERENT VERSION: clients compile in process"
    print(
        f"running: pid {info.pid}, compiler {info.compiler_version} ({state}), cache {info.cache_dir}, "
        f"up {time.time() - info.started_at:.0f} s"
    )
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    config = _config(args)
    try:
        stats = _stats(config.address)
    except grpc.RpcError:
        print(f"no daemon answers on {config.address}", file=sys.stderr)
        return 3
    if args.json:
        print(json_format.MessageToJson(stats, always_print_fields_with_no_presence=True))
        return 0
    print(format_stats(stats))
    return 0


def format_stats(s: svc.StatsResponse) -> str:
    hits = s.memory.hits + s.disk.hits
    asked = s.requests + s.lookups
    rows = [
        ("requests (stream / lookup)", f"{s.requests} / {s.lookups}"),
        (
            "hits: memory / disk",
            f"{s.memory.hits} / {s.disk.hits} ({100 * hits / max(1, asked):.1f} % of requests)",
        ),
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
            f"{s.disk.entries}, {s.disk.bytes}, {s.disk.evictions}",
        ),
        ("connected clients, uptime", f"{s.connected_clients}, {s.uptime_seconds:.0f} s"),
        ("dropped jobs (nobody waiting)", str(s.dropped_jobs)),
        ("disk tier errors (answered as misses)", str(s.disk_errors)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _cache(args: argparse.Namespace) -> ExecutableCache:
    config = _config(args)
    return ExecutableCache(
        config.cache_dir / "executables",
        1,
        config.disk_cache_bytes,
        tag=compiler.compiler_version(),
    )


def cmd_cache(args: argparse.Namespace) -> int:
    directory = _config(args).cache_dir / "executables"
    if not (directory / "cache.db").is_file():
        # Opening a cache creates it: these commands look at one and change nothing else.
        print(
            f"error: no executable cache at {directory} (a daemon or an in-process compile "
            f"creates it on its first compile; --cache-dir names another directory)",
            file=sys.stderr,
        )
        return 2
    cache = _cache(args)
    try:
        if args.cache_command == "ls":
            total = 0
            for key, size, tag in cache.entries():
                total += size
                print(f"{key}  {size:>9} B  compiler {tag}")
            print(f"{total} bytes in {cache.disk_stats()[0]} entries at {cache.directory}")
        elif args.cache_command == "verify":
            good, bad = cache.verify()
            print(f"{good} good, {bad} corrupt (deleted)")
            return 1 if bad else 0
        elif args.cache_command == "prune":
            print(f"pruned {cache.prune()} entries (expired, or from other compiler versions)")
        elif args.cache_command == "clear":
            print(f"cleared {cache.clear()} entries")
    finally:
        cache.close()
    return 0


def cmd_precompile(args: argparse.Namespace) -> int:
    from trnsim.compiler.manifest import ManifestError
    from trnsim.daemon import precompile

    try:
        requests = precompile.load([Path(p) for p in args.manifests])
    except (OSError, ManifestError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = _config(args)
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
        summary = precompile.run(requests, config.address, args.jobs)
    except grpc.RpcError as e:
        print(f"error: the daemon on {config.address} failed: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    print("\n".join(summary.lines()))
    return 1 if summary.failed else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from trnsim.daemon import doctor

    checks = doctor.run(_config(args))
    print(doctor.report(checks))
    return 0 if all(c.ok for c in checks) else 1


def cmd_profile(args: argparse.Namespace) -> int:
    """Device time by op, by source line and by engine, from a profile's trace."""
    from trnsim.simulator import trace

    try:
        events = trace.read(Path(args.file))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(trace.summary(events, args.top))
    return 0


class _Version(argparse.Action):
    """--version: the package version and git commit (computed only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import trnsim

        print(f"trnsim {trnsim.package_version()} (commit {trnsim.commit()})")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trnsim", description=__doc__)
    p.add_argument("--version", action=_Version)
    p.add_argument("--address", help=f"daemon address (default {default_address()})")
    p.add_argument("--system", action="store_true", help=f"the systemd daemon ({SYSTEM_SOCKET})")
    sub = p.add_subparsers(dest="command", required=True)
    daemon = sub.add_parser("daemon", help="run or control the compile daemon")
    dsub = daemon.add_subparsers(dest="daemon_command", required=True)
    for name in ("serve", "start"):
        d = dsub.add_parser(
            name, help="run in the foreground" if name == "serve" else "start in the background"
        )
        d.add_argument(
            "--address", default=argparse.SUPPRESS, help="unix:/path/to.sock or host:port"
        )
        d.add_argument("--cache-dir", help=f"default {default_cache_dir()}")
        d.add_argument(
            "--workers", type=int, help="compile processes (default: from CPUs and free memory)"
        )
        d.add_argument(
            "--idle-exit", type=float, help="exit after this many idle seconds with no client"
        )
        d.add_argument(
            "--memory-cache-mb", type=int, help="the memory tier's size in MiB (default 256)"
        )
        d.add_argument(
            "--disk-cache-mb", type=int, help="the disk tier's size in MiB (default 4096)"
        )
        d.add_argument("--compile-timeout", type=float, help="seconds before a compile is killed")
        d.add_argument(
            "--system",
            action="store_true",
            default=argparse.SUPPRESS,
            help="the system-wide daemon's socket and cache (systemd: deploy/systemd)",
        )
    for name in ("stop", "status"):
        d = dsub.add_parser(
            name,
            help="stop the daemon (it drains first)"
            if name == "stop"
            else "is a daemon running: pid, compiler version, cache, uptime (exit 3 if not)",
        )
        d.add_argument(
            "--address", default=argparse.SUPPRESS, help="unix:/path/to.sock or host:port"
        )
    stats = sub.add_parser("stats", help="the daemon's counters")
    stats.add_argument("--json", action="store_true", help="the counters as JSON")
    cache = sub.add_parser("cache", help="the on-disk executable cache")
    cache.add_argument("--cache-dir", help=f"default {default_cache_dir()}")
    cache.add_argument(
        "cache_command",
        choices=["ls", "verify", "prune", "clear"],
        help="ls: every entry; verify: check digests, delete corrupt entries; prune: expired "
        "entries and other compiler versions; clear: everything",
    )
    profile = sub.add_parser("profile", help="the table of a profile (NEURON_PROFILE=FILE)")
    profile.add_argument("file", help="a trace written by NEURON_PROFILE or torch.neuron.profile")
    profile.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    pre = sub.add_parser(
        "precompile",
        help="compile ahead, through the daemon, the graphs runs recorded (NEURON_RECORD_GRAPHS)",
        description="Compiles every graph of the manifests (per-op executables, adaptive "
        "mode's fused graphs, compiled regions, shape buckets) through the host's daemon "
        "(started if none runs), so the next run compiles nothing. Manifests merge; what "
        "the cache holds already is skipped.",
    )
    pre.add_argument(
        "manifests", nargs="+", metavar="MANIFEST", help="files NEURON_RECORD_GRAPHS wrote"
    )
    pre.add_argument(
        "--jobs",
        type=int,
        default=16,
        help="compiles in flight at once (default 16; the daemon's workers run them)",
    )
    sub.add_parser(
        "doctor",
        help="check this host: torch, the device, NEURON_* variables, the daemon, "
        "directories, the cache, disk and memory (exit 1 if a check fails)",
    )
    sub.add_parser("explain", help="FILE: the report NEURON_EXPLAIN=FILE wrote (runs torch)")
    sub.add_parser("registry", help="the shape registry: test FILE | stats FILE (runs torch)")
    sub.add_parser("record", help="-o FILE -- COMMAND: record the op signatures COMMAND runs")
    return p


# Subcommands that run PyTorch: the daemon never imports torch, so they are run as
# `python -m trnsim.client.registry ...` in a process of their own.
_TORCH_COMMANDS = ("registry", "record", "explain")
# Files a run writes at its exit (the client's variables): never for a command of ours.
RUN_OUTPUTS = ("NEURON_EXPLAIN", "NEURON_PROFILE", "NEURON_RECORD_GRAPHS", "NEURON_RECORD_SHAPES")


def _run_torch_command(argv: list[str]) -> int:
    # What a run writes at exit must not be rewritten by these commands' own processes.
    quiet = {k: v for k, v in os.environ.items() if k not in RUN_OUTPUTS}
    if argv[0] == "explain":  # (imported with the device: not run as -m)
        code = "import sys; from trnsim.client.explain import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.call([sys.executable, "-c", code, *argv[1:]], env=quiet)
    rest = argv[1:] if argv[0] == "registry" else argv
    command = [sys.executable, "-m", "trnsim.client.registry", *rest]
    return subprocess.call(command, env=quiet if argv[0] != "record" else None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _TORCH_COMMANDS:
        return _run_torch_command(argv)
    args = parser().parse_args(argv)
    args.system = getattr(args, "system", False)
    try:
        if args.command == "daemon":
            return {"serve": cmd_serve, "start": cmd_start, "stop": cmd_stop, "status": cmd_status}[
                args.daemon_command
            ](args)
        if args.command == "stats":
            return cmd_stats(args)
        if args.command == "profile":
            return cmd_profile(args)
        if args.command == "doctor":
            return cmd_doctor(args)
        if args.command == "precompile":
            return cmd_precompile(args)
        return cmd_cache(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
