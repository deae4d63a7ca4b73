"""The daemon's command-line options (`trnsim daemon serve|start`, `python -m trnsim.daemon`)
and the DaemonConfig they make, with `trnsim`'s own --address and --system."""

from __future__ import annotations

import argparse
from pathlib import Path

from trnsim.daemon.config import (
    SYSTEM_SOCKET,
    ConfigError,
    DaemonConfig,
    default_cache_dir,
    system_cache_dir,
)


def add_server_options(p: argparse.ArgumentParser) -> None:
    """Where a daemon about to start listens and keeps its cache, and its limits."""
    p.add_argument("--address", default=argparse.SUPPRESS, help="unix:/path/to.sock or host:port")
    p.add_argument("--cache-dir", help=f"default {default_cache_dir()}")
    p.add_argument(
        "--workers", type=int, help="compile processes (default: from CPUs and free memory)"
    )
    p.add_argument(
        "--idle-exit", type=float, help="exit after this many idle seconds with no client"
    )
    p.add_argument(
        "--memory-cache-mb", type=int, help="the memory tier's size in MiB (default 256)"
    )
    p.add_argument("--disk-cache-mb", type=int, help="the disk tier's size in MiB (default 4096)")
    p.add_argument("--compile-timeout", type=float, help="seconds before a compile is killed")
    p.add_argument(
        "--drain-timeout",
        type=float,
        help="on SIGTERM, seconds running compiles may take to finish before their clients "
        "are told to compile in process and the workers are stopped (default 30)",
    )
    p.add_argument(
        "--remote",
        metavar="URL",
        help="the cluster cache tier shared by every host's daemon: redis://HOST:PORT/DB or "
        "unix:///path/redis.sock?db=0 (default: NEURON_CACHE_REMOTE; docs/operations.md)",
    )
    p.add_argument(
        "--remote-key-file",
        metavar="FILE",
        help="the cluster key signing the remote tier's entries, readable by this user only "
        "(default: NEURON_CACHE_REMOTE_KEY_FILE)",
    )
    p.add_argument(
        "--remote-deadline",
        type=float,
        metavar="S",
        help="seconds one call to the remote store may take before the tier is turned off and "
        "retried in the background (default: NEURON_CACHE_REMOTE_DEADLINE, else 0.5)",
    )
    p.add_argument(
        "--system",
        action="store_true",
        default=argparse.SUPPRESS,
        help="the system-wide daemon's socket and cache (systemd: deploy/systemd)",
    )


def config_from(args: argparse.Namespace) -> DaemonConfig:
    """The defaults (daemon/config.py), overridden by the options given; a command without
    an option leaves its default."""
    config = DaemonConfig()
    if getattr(args, "system", False):
        config.system = True
        config.address = f"unix:{SYSTEM_SOCKET}"
        config.cache_dir = system_cache_dir()
    address = getattr(args, "address", None)
    if address:
        config.address = address if ":" in address else f"unix:{address}"
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
    if getattr(args, "drain_timeout", None) is not None:
        config.drain_timeout_s = args.drain_timeout
    if getattr(args, "remote", None) is not None:
        config.remote = args.remote
    if getattr(args, "remote_key_file", None):
        config.remote_key_file = Path(args.remote_key_file)
    if getattr(args, "remote_deadline", None) is not None:
        if not 0 < args.remote_deadline <= 60:
            raise ConfigError(f"--remote-deadline {args.remote_deadline}: above 0, up to 60")
        config.remote_deadline_s = args.remote_deadline
    return config
