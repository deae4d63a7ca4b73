"""The transformers sweep: every model type of the installed transformers, shrunk, built
offline from its config, trained 3 SGD steps on CPU and in neuron eager, adaptive and compiled
mode, judged as the zoo judges; results cached per target; docs/SWEEP.md written from them.

    .venv/bin/python tests/sweep/sweep.py [KEY ...] [--jobs 2] [--shard I/N] [--all-heads]
        [--build-only] [--timeout 420] [--record FILE] [--report docs/SWEEP.md] [--list]

--failed runs again only the cached targets that did not pass (after a fix), --rerun
everything.
KEY is TYPE or TYPE:HEAD (default: every type's primary head; --all-heads: every head the
input generator knows). Each target runs in its own process (worker.py); a crash or a hang is
its result. Results are kept in --cache (default ~/.cache/trnsim-sweep/COMMIT-tfVERSION/, one
JSON file per target), so a sweep stopped part way resumes where it stopped, and shards run
as separate commands (--shard 1/4 ... 4/4) fill one cache. --report writes the table and its
summary from every cached result of the run's targets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent / "zoo")]

import transformers
from catalog import Target, targets
from pool import run_worker
from report import all_passed, cell, representative_keys, write_report

WORKER = HERE / "worker.py"
JOBS = 2
TIMEOUT_S = 420.0
DEFAULT_REPORT = ROOT / "docs" / "SWEEP.md"


def commit() -> str:
    """The trnsim commit results are keyed by (with -dirty for uncommitted changes)."""
    out = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def default_cache() -> Path:
    """~/.cache/trnsim-sweep/COMMIT-tfVERSION (XDG_CACHE_HOME respected)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "trnsim-sweep" / f"{commit()}-tf{transformers.__version__}"


def cache_file(cache: Path, target: Target) -> Path:
    """Where one target's result is kept."""
    return cache / f"{target.key.replace(':', '__')}.json"


def cached(cache: Path, target: Target) -> dict[str, Any] | None:
    """A target's cached result, if any (an unreadable file counts as none)."""
    try:
        return dict(json.loads(cache_file(cache, target).read_text()))
    except (OSError, ValueError):
        return None


def worker_env(key: str, record: str | None) -> dict[str, str]:
    """In-process compiles that burn no CPU (the sweep judges numerics, not time to first
    step); op signatures recorded into record (credited to the target)."""
    env = dict(os.environ)
    env.setdefault("NEURON_COMPILE_DAEMON", "off")
    env.setdefault("NEURON_SIM_COMPILE_SCALE", "0")
    env["NEURON_RECORD_SOURCE"] = key
    if record:
        env["NEURON_RECORD_SHAPES"] = str(Path(record).resolve())
    return env


def run_one(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """One target in its own process; its result is cached."""
    command = [sys.executable, str(WORKER), target.key, "--steps", str(args.steps)]
    if args.build_only:
        command.append("--build-only")
    result = run_worker(target.key, args.timeout, command, worker_env(target.key, args.record))
    result.setdefault("key", target.key)
    result["model_type"], result["head"] = target.model_type, target.head
    result["build_only"] = args.build_only
    path = cache_file(args.cache, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def shard(chosen: list[Target], spec: str | None) -> list[Target]:
    """The I-th of N interleaved shards (I from 1)."""
    if not spec:
        return chosen
    i, n = (int(x) for x in spec.split("/"))
    if not 1 <= i <= n:
        raise SystemExit(f"--shard {spec}: I must be within 1..N")
    return chosen[i - 1 :: n]


def select(args: argparse.Namespace) -> list[Target]:
    """The targets named (by type or key), or all of them; then the shard."""
    every = targets(all_heads=args.all_heads or bool(args.keys) or args.representative)
    if args.representative:
        args.keys = [*args.keys, *representative_keys()]
        if not args.keys:
            raise SystemExit("no representative set yet: `make sweep` chooses it (--report)")
    if args.keys:
        wanted = set(args.keys)
        primary = {t.model_type: t for t in reversed(targets())}
        chosen = [t for t in every if t.key in wanted]
        chosen += [primary[k] for k in args.keys if k in primary and primary[k] not in chosen]
        unknown = wanted - {t.key for t in chosen} - set(primary)
        if unknown:
            raise SystemExit(f"unknown target(s): {', '.join(sorted(unknown))} (see --list)")
        return shard(chosen, args.shard)
    return shard(every, args.shard)


def needs_run(result: dict[str, Any] | None, args: argparse.Namespace) -> bool:
    """A target runs unless cached (a build-only result does not stand for a full run)."""
    if args.failed:  # (only what ran and did not pass)
        return result is not None and not (
            result.get("built") if args.build_only else all_passed(result)
        )
    if result is None or args.rerun:
        return True
    return bool(result.get("build_only")) and not args.build_only


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="make sweep runs every primary target and writes docs/SWEEP.md.",
    )
    parser.add_argument("keys", nargs="*", metavar="KEY", help="TYPE or TYPE:HEAD (default: all)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="workers at a time (default 2)")
    parser.add_argument("--shard", metavar="I/N", help="run only the I-th of N shards")
    parser.add_argument("--all-heads", action="store_true", help="every known head of each type")
    parser.add_argument("--build-only", action="store_true", help="build and train on CPU only")
    parser.add_argument("--steps", type=int, default=3, help="SGD steps per mode (default 3)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per target")
    parser.add_argument("--cache", type=Path, help="results directory (default: by commit)")
    parser.add_argument("--rerun", action="store_true", help="run targets even when cached")
    parser.add_argument(
        "--failed", action="store_true", help="run again the cached targets that did not pass"
    )
    parser.add_argument("--record", metavar="FILE", help="record op signatures into this registry")
    parser.add_argument("--report", metavar="FILE", help="write the table (e.g. docs/SWEEP.md)")
    parser.add_argument("--list", action="store_true", help="print the targets and exit")
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: summarise (and --report) the cache"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 unless every target passed in every mode"
    )
    parser.add_argument(
        "--representative",
        action="store_true",
        help="the representative set the last report chose (tests/sweep/representative.txt)",
    )
    args = parser.parse_args(argv)
    args.cache = args.cache or default_cache()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs what is not cached, then prints (and with --report writes) the summary."""
    args = parse_args(argv)
    chosen = select(args)
    if args.list:
        print("\n".join(t.key for t in chosen))
        return 0
    # In a fixed pseudo-random order, so that a sweep stopped part way has sampled the whole
    # catalogue, not its first letters.
    todo = sorted(
        (t for t in chosen if needs_run(cached(args.cache, t), args) and not args.report_only),
        key=lambda t: hashlib.sha256(t.key.encode()).hexdigest(),
    )
    print(
        f"sweep: {len(chosen)} targets, {sum(cached(args.cache, t) is not None for t in chosen)}"
        f" cached in {args.cache}, "
        f"{len(todo)} to run{' again (they did not pass)' if args.failed else ''}, "
        f"{args.jobs} at a time",
        file=sys.stderr,
        flush=True,
    )
    start, done = time.monotonic(), 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, t, args) for t in todo]
        for future in as_completed(futures):
            done += 1
            result = future.result()
            elapsed = time.monotonic() - start
            eta = elapsed / done * (len(todo) - done)
            print(
                f"[{done}/{len(todo)} {elapsed / 60:.0f} min, ~{eta / 60:.0f} min left] "
                f"{result['key']}: {cell(result)} ({result['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    results = [r for r in (cached(args.cache, t) for t in chosen) if r is not None]
    report = Path(args.report) if args.report else None
    summary = write_report(results, report, args.cache.name, len(chosen))
    print(summary)
    if args.strict and not all(all_passed(r) for r in results):
        failed = [r["key"] for r in results if not all_passed(r)]
        print(f"not passing: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
