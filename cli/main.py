"""The `trnsim` command: daemon serve|start|stop|status, stats, cache ls|verify|prune|clear,
precompile MANIFEST (compile ahead what runs recorded), profile FILE (a profile's table),
doctor (is this host ready), explain FILE (why: cuts, breaks), registry test|stats and
record (the shape registry), --version."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from trnsim.cli import cache, daemon, doctor, precompile, profile, stats, torch_commands
from trnsim.daemon.config import SYSTEM_SOCKET, ConfigError, default_address, default_cache_dir
from trnsim.daemon.launcher import DaemonNotAnswering
from trnsim.daemon.options import add_server_options

if TYPE_CHECKING:  # (generic in typeshed only)
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

# The commands besides `daemon` (cli/daemon.py), by name.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "stats": stats.cmd_stats,
    "cache": cache.cmd_cache,
    "profile": profile.cmd_profile,
    "precompile": precompile.cmd_precompile,
    "doctor": doctor.cmd_doctor,
}


class _Version(argparse.Action):
    """--version: the package version and git commit (computed only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import trnsim

        print(f"trnsim {trnsim.package_version()} (commit {trnsim.commit()})")
        parser.exit()


def _add_daemon(sub: Subparsers) -> None:
    daemon_parser = sub.add_parser("daemon", help="run or control the compile daemon")
    dsub = daemon_parser.add_subparsers(dest="daemon_command", required=True)
    add_server_options(dsub.add_parser("serve", help="run in the foreground"))
    add_server_options(dsub.add_parser("start", help="start in the background"))
    for name, text in (
        ("stop", "stop the daemon (it drains first)"),
        ("status", "is a daemon running: pid, compiler version, cache, uptime (exit 3 if not)"),
    ):
        d = dsub.add_parser(name, help=text)
        d.add_argument(
            "--address", default=argparse.SUPPRESS, help="unix:/path/to.sock or host:port"
        )


def _add_cache(sub: Subparsers) -> None:
    cache_parser = sub.add_parser(
        "cache", help="the on-disk executable cache, and the cluster's remote tier"
    )
    cache_parser.add_argument("--cache-dir", help=f"default {default_cache_dir()}")
    cache_parser.add_argument(
        "--remote",
        metavar="URL",
        help="for `remote`: the cluster tier's store (default: NEURON_CACHE_REMOTE)",
    )
    cache_parser.add_argument(
        "cache_command",
        choices=["ls", "verify", "prune", "clear", "remote"],
        help="ls: every entry; verify: check digests, delete corrupt entries; prune: expired "
        "entries and other compiler versions; clear: everything; remote: the cluster tier's "
        "store (entries, memory, eviction policy) and, from the daemon, its counters",
    )


def _add_profile(sub: Subparsers) -> None:
    profile_parser = sub.add_parser("profile", help="the table of a profile (NEURON_PROFILE=FILE)")
    profile_parser.add_argument(
        "file", help="a trace written by NEURON_PROFILE or torch.neuron.profile"
    )
    profile_parser.add_argument("--top", type=int, default=15, help="rows per table (default 15)")


def _add_precompile(sub: Subparsers) -> None:
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trnsim", description=__doc__)
    p.add_argument("--version", action=_Version)
    p.add_argument("--address", help=f"daemon address (default {default_address()})")
    p.add_argument("--system", action="store_true", help=f"the systemd daemon ({SYSTEM_SOCKET})")
    sub = p.add_subparsers(dest="command", required=True)
    _add_daemon(sub)
    stats_parser = sub.add_parser("stats", help="the daemon's counters")
    stats_parser.add_argument("--json", action="store_true", help="the counters as JSON")
    _add_cache(sub)
    _add_profile(sub)
    _add_precompile(sub)
    sub.add_parser(
        "doctor",
        help="check this host: torch, the device, NEURON_* variables, the daemon, "
        "directories, the cache, disk and memory (exit 1 if a check fails)",
    )
    # Listed for --help only: main() hands these to the client, which parses their arguments.
    sub.add_parser("explain", help="FILE: the report NEURON_EXPLAIN=FILE wrote (runs torch)")
    sub.add_parser("registry", help="the shape registry: test FILE | stats FILE (runs torch)")
    sub.add_parser("record", help="-o FILE -- COMMAND: record the op signatures COMMAND runs")
    return p


def main(argv: list[str] | None = None) -> int:
    """`trnsim ARGS...`: the exit status. The commands that run the client are handed to it
    whole, before any parsing here (their options are the client's)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in torch_commands.COMMANDS:
        return torch_commands.run(argv)
    args = parser().parse_args(argv)
    try:
        if args.command == "daemon":
            return daemon.COMMANDS[args.daemon_command](args)
        return COMMANDS[args.command](args)
    except (ConfigError, DaemonNotAnswering) as e:  # (what to fix, or to wait for, is said)
        print(f"error: {e}", file=sys.stderr)
        return 2
