"""`trnsim cache ls|verify|prune|clear`: the on-disk executable cache, read or trimmed
with or without a daemon serving it (cache.py's maintenance is safe beside one)."""

from __future__ import annotations

import argparse
import sqlite3
import sys

import diskcache
import grpc
from trnsim import compiler
from trnsim.cli.stats import remote_rows, stats_of
from trnsim.daemon.cache import DiskTierOff, ExecutableCache
from trnsim.daemon.options import config_from
from trnsim.daemon.remote import StoreError, open_store


def _cache(args: argparse.Namespace) -> ExecutableCache:
    config = config_from(args)
    return ExecutableCache(
        config.cache_dir / "executables",
        1,
        config.disk_cache_bytes,
        tag=compiler.compiler_version(),
        retry_s=None,  # (a disk tier that cannot open: cmd_cache says why, and stops)
    )


def cmd_cache(args: argparse.Namespace) -> int:
    if args.cache_command == "remote":
        return _remote(args)
    directory = config_from(args).cache_dir / "executables"
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
        return _run(args.cache_command, cache)
    except DiskTierOff as e:  # (opening it failed: read-only, full, locked)
        print(f"error: cannot use the cache at {directory}: {e}", file=sys.stderr)
    except (sqlite3.Error, OSError, diskcache.Timeout) as e:
        print(
            f"error: `trnsim cache {args.cache_command}` stopped: {cache.why(e)}", file=sys.stderr
        )
    finally:
        cache.close()
    return 3


def _run(command: str, cache: ExecutableCache) -> int:
    if command == "ls":
        total = 0
        for key, size, tag in cache.entries():
            total += size
            print(f"{key}  {size:>9} B  compiler {tag}")
        print(f"{total} bytes in {cache.disk_stats()[0]} entries at {cache.directory}")
    elif command == "verify":
        good, bad = cache.verify()
        print(f"{good} good, {bad} corrupt (deleted)")
        return 1 if bad else 0
    elif command == "prune":
        print(f"pruned {cache.prune()} entries (expired, or from other compiler versions)")
    elif command == "clear":
        print(f"cleared {cache.clear()} entries")
    return 0


def _remote(args: argparse.Namespace) -> int:
    """`trnsim cache remote`: the store as it says it is, then the daemon's counters of it."""
    config = config_from(args)
    if not config.remote:
        print(
            "no remote tier: set NEURON_CACHE_REMOTE=redis://HOST:PORT/DB (and "
            "NEURON_CACHE_REMOTE_KEY_FILE) for the daemon, or pass --remote URL "
            "(docs/operations.md: The cluster tier)",
            file=sys.stderr,
        )
        return 2
    store = open_store(config.remote, config.remote_deadline_s)
    try:
        st = store.stat()
    except StoreError as e:
        print(f"error: the remote store {store.name} does not answer: {e}", file=sys.stderr)
        return 3
    finally:
        store.close()
    limit = f"of {st.max_bytes} bytes" if st.max_bytes > 0 else "(no maxmemory: unbounded)"
    print(
        f"{store.name}: {st.entries} keys, {st.used_bytes} bytes used {limit}, policy {st.policy}"
    )
    try:
        stats = stats_of(config.address)
    except grpc.RpcError:
        print(f"(no daemon answers on {config.address}: no counters)")
        return 0
    for k, v in remote_rows(stats.remote):
        print(f"{k:<42}  {v}")
    return 0
