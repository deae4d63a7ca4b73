"""`trnsim daemon serve|start|stop|status`: run the compile daemon, or control the one
that answers on an address."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from trnsim import compiler
from trnsim.daemon import launcher, pathlock
from trnsim.daemon.config import socket_path
from trnsim.daemon.options import config_from
from trnsim.daemon.server import serve_in_foreground


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        return serve_in_foreground(config_from(args))
    except pathlock.PathHeld as e:  # (the same status as `python -m trnsim.daemon`)
        print(f"error: {e}", file=sys.stderr)
        return pathlock.EXIT_PATH_HELD


def cmd_start(args: argparse.Namespace) -> int:
    config = config_from(args)
    info = launcher.get_info(config.address)
    if info is not None:
        print(f"already running: pid {info.pid} on {config.address}")
        return 0
    try:
        info = launcher.ensure_daemon(config.address, idle_exit_s=config.idle_exit_s)
    except launcher.DaemonNotAnswering as e:
        print(f"error: {_not_answering(e)}", file=sys.stderr)
        return 1
    path = socket_path(config.address)
    holder = pathlock.held_by(path) if info is None and path is not None else None
    if holder is not None:
        print(
            f"starting: pid {holder or '?'} holds {config.address} but does not answer yet "
            f"(opening its cache?); `trnsim daemon status` tells when it does"
        )
        return 0
    if info is None:
        print(
            f"error: the daemon did not start on {config.address}; see daemon.log next to the socket",
            file=sys.stderr,
        )
        return 1
    print(f"started: pid {info.pid} on {config.address}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    config = config_from(args)
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


# How long `status` waits for an answer; the health check beside it tells within this time
# a daemon that is stopped or wedged from one that is only loaded.
STATUS_DEADLINE_S = 2.0


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0: running and answering; 1: a process holds the address but does not answer
    (stopped, swapped out, wedged: its clients compile in process); 3: not running."""
    config = config_from(args)
    try:
        info = launcher.probe(
            config.address,
            STATUS_DEADLINE_S,
            version=compiler.compiler_version(),
            fmt=compiler.FORMAT_VERSION,
        )
    except launcher.DaemonNotAnswering as e:
        print(_not_answering(e))
        return 1
    if info is None:
        print(f"not running (nothing answers on {config.address})")
        return 3
    state = "compatible" if info.compatible else "DIFFERENT VERSION: clients compile in process"
    print(
        f"running: pid {info.pid}, compiler {info.compiler_version} ({state}), cache {info.cache_dir}, "
        f"up {time.time() - info.started_at:.0f} s"
    )
    return 0


def _not_answering(e: launcher.DaemonNotAnswering) -> str:
    """What `status` says of a daemon that holds its address but does not answer."""
    if e.pid is None:
        return f"running, not answering: nothing answered on {e.address} within {e.seconds:g} s"
    state = launcher.process_state(e.pid) or "state unknown"
    fix = f"kill -CONT {e.pid}" if state == "stopped" else f"kill {e.pid} (or wait)"
    return (
        f"running (pid {e.pid}, {state}), not answering within {e.seconds:g} s on "
        f"{e.address}: its clients compile in process until it answers ({fix})"
    )


COMMANDS = {"serve": cmd_serve, "start": cmd_start, "stop": cmd_stop, "status": cmd_status}
