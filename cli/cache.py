"""`trnsim cache ls|verify|prune|clear`: the on-disk executable cache, read or trimmed
with or without a daemon serving it (cache.py's maintenance is safe beside one)."""

from __future__ import annotations

import argparse
import sqlite3
import sys

import diskcache
from trnsim import compiler
from trnsim.daemon.cache import DiskTierOff, ExecutableCache
from trnsim.daemon.options import config_from


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
