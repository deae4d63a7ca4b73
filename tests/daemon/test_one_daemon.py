"""One daemon per socket path (daemon/pathlock.py): a crowd of starts, a second daemon, a
locked cache under auto-start, and a daemon that removes only its own socket."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trnsim.daemon import launcher, pathlock
from trnsim.daemon.cache import ExecutableCache

from .crowd import (
    child_env,
    daemons_on,
    hold_exclusive,
    listening_sockets,
    settle,
    start_clients,
    start_daemons,
    stop_all,
)
from .helpers import start_daemon


@pytest.fixture
def crowd_path(short_tmp):
    """An address in short_tmp whose daemons, however many there are, are stopped after;
    `started` collects the processes the test started, reaped after."""
    address = f"unix:{short_tmp / 'run' / 'c.sock'}"
    started: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
    yield address, started
    stop_all(address)
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def _serve_command(address: str, cache_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "trnsim.daemon", "--address", address]
    return [*cmd, "--cache-dir", str(cache_dir), "--workers", "1"]


def test_ten_simultaneous_starts_leave_one_daemon(short_tmp, crowd_path):
    """Ten daemons started at once on one path and cache: one serves, nine refuse with the
    path's status (75), and one socket listens under the path's name."""
    address, started = crowd_path
    path = Path(address[len("unix:") :])
    cache = short_tmp / "cache"
    procs = start_daemons(address, cache, 10, short_tmp / "logs", child_env(cache))
    started += procs
    settle(procs, alive=1, timeout_s=90)
    statuses = sorted(p.returncode for p in procs if p.poll() is not None)
    assert statuses == [pathlock.EXIT_PATH_HELD] * 9, statuses
    info = launcher.get_info(address, timeout=10)
    assert info is not None
    assert [p.pid for p in daemons_on(address)] == [info.pid]
    assert listening_sockets(path) == 1
    refusals = [f.read_text() for f in (short_tmp / "logs").iterdir()]
    assert sum(f"another compile daemon (pid {info.pid}) holds" in r for r in refusals) == 9


def test_a_second_daemon_refuses_and_says_who_holds_the_path(daemon):
    """The refusal names the holder and what to do; the first daemon's socket is untouched."""
    path = Path(daemon.address[len("unix:") :])
    inode = path.stat().st_ino
    done = subprocess.run(
        _serve_command(daemon.address, daemon.cache_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == pathlock.EXIT_PATH_HELD
    assert f"another compile daemon (pid {daemon.pid()}) holds {path}" in done.stderr
    assert f"trnsim --address {daemon.address} daemon stop" in done.stderr
    assert path.stat().st_ino == inode
    info = launcher.get_info(daemon.address)
    assert info is not None and info.pid == daemon.pid()
    assert pathlock.held_by(path) == daemon.pid()


def test_a_daemon_removes_only_its_own_socket(daemon):
    """An operator replaced the socket under a running daemon: stopping the daemon leaves the
    new socket in place, and the path free for the next daemon."""
    path = Path(daemon.address[len("unix:") :])
    path.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(str(path))
        other.listen()
        inode = path.stat().st_ino
        assert daemon.stop() == 0
        assert path.exists() and path.stat().st_ino == inode, "another's socket was removed"
        assert pathlock.held_by(path) is None
        assert pathlock.lock_path(path).read_text() == "", "no pid: no daemon"
    finally:
        other.close()


def test_a_killed_daemon_leaves_the_path_to_the_next(short_tmp):
    """The kernel lets the path go with the process: after SIGKILL (its socket left behind)
    the next daemon takes the path at once, and removes the dead one's socket first."""
    first = start_daemon(short_tmp, "--workers", "1")
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    path = Path(first.address[len("unix:") :])
    assert path.exists() and pathlock.held_by(path) is None
    second = start_daemon(short_tmp, "--workers", "1")
    try:
        assert pathlock.held_by(path) == second.pid()
        assert listening_sockets(path) == 1
    finally:
        second.stop()


@pytest.mark.slow
def test_a_locked_cache_does_not_make_auto_start_start_a_second_daemon(short_tmp, crowd_path):
    """cache.db under an exclusive lock (a long VACUUM) for longer than the clients wait: the
    daemon they start waits on it, the clients give up and ask again and again (each wait
    shortened to 1 s here, from 15), and once the lock goes one daemon serves them all."""
    address, started = crowd_path
    path = Path(address[len("unix:") :])
    cache = short_tmp / "cache"
    cache.mkdir(mode=0o700)
    ExecutableCache(cache / "executables", 1 << 20, 1 << 24).close()
    holder = hold_exclusive(cache / "executables" / "cache.db", seconds=8)
    try:
        clients = start_clients(address, 3, child_env(cache), wait_s=1.0, give_up_s=60)
        started += clients
        counts = []
        while holder.poll() is None:  # (the clients start a daemon, give up on it, ask again)
            counts.append(len(daemons_on(address)))
            time.sleep(0.2)
        assert launcher.get_info(address, timeout=1) is None or counts[-1] == 1
    finally:
        holder.communicate(timeout=30)
    assert counts.count(1) >= 10, f"a daemon was waiting on the lock for 2 s at least: {counts}"
    assert max(counts) == 1, counts
    pids = {c.communicate(timeout=90)[0].strip() for c in clients}
    assert len(pids) == 1 and pids != {"0"}, pids
    assert [str(p.pid) for p in daemons_on(address)] == list(pids)
    assert listening_sockets(path) == 1


def test_a_tcp_port_takes_one_daemon(short_tmp):
    """A second daemon on a daemon's TCP port fails to bind (gRPC's SO_REUSEPORT is off)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    cache = short_tmp / "cache"
    env = child_env(cache)
    first = subprocess.Popen(_serve_command(address, cache), env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while launcher.get_info(address, timeout=0.5) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert launcher.get_info(address) is not None
        second = subprocess.run(
            _serve_command(address, cache),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2 and f"could not listen on {address}" in second.stderr
        info = launcher.get_info(address)
        assert info is not None and info.pid == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
