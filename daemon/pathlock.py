"""One daemon per socket path: the lock a daemon holds on "<socket>.lock" for its whole life."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from trnsim.daemon.config import ConfigError

# `python -m trnsim.daemon` and `trnsim daemon serve` exit with this (EX_TEMPFAIL) when
# another daemon holds the path: "a daemon is there", which the launcher waits for.
EXIT_PATH_HELD = 75

# A probe (held_by) holds the lock shared for microseconds; a starting daemon retries this
# long before it takes a failed attempt for another daemon's lock.
_GRACE_S = 0.5


class PathHeld(ConfigError):
    """Recoverable for whoever wanted a daemon on this path: one is there already (running,
    or still opening its cache), and serves it until it exits. Use it, or stop it first."""

    def __init__(self, socket: Path, pid: int) -> None:
        who = f"pid {pid}" if pid else "a process that has not yet written its pid"
        super().__init__(
            f"another compile daemon ({who}) holds {socket} (lock {lock_path(socket)}) and "
            f"serves it until it exits; use that daemon, or stop it first "
            f"(trnsim --address unix:{socket} daemon stop) and start this one again"
        )
        self.pid = pid


def lock_path(socket: Path) -> Path:
    """The lock file next to the socket: compiler.sock -> compiler.sock.lock."""
    return socket.with_name(socket.name + ".lock")


class PathLock:
    """The exclusive flock a daemon holds on its socket's lock file, from before it opens
    its cache until after it has removed its socket. The kernel releases it when the process
    dies, however it dies: a lock file left behind is never stale, and is never removed
    (removing it would let two daemons lock two different files of one name)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, socket: Path, mode: int = 0o600) -> PathLock:
        """Takes the lock without waiting for a daemon that holds it (PathHeld, naming its
        pid) and writes this process's pid into the file. The socket's directory exists."""
        path = lock_path(socket)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as e:
            raise ConfigError(f"cannot open the daemon's lock file {path}: {e}") from e
        deadline = time.monotonic() + _GRACE_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    pid = _read_pid(fd)
                    os.close(fd)
                    raise PathHeld(socket, pid) from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        """Empties the file (no pid: no daemon) and lets the next daemon take the path."""
        if self._fd < 0:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # (closing the only descriptor releases the flock)
        self._fd = -1


def held_by(socket: Path) -> int | None:
    """The pid of the daemon holding socket's path (0 when it has not written it yet), or
    None when no process holds it, or the lock file cannot be read. Probes with a shared
    lock held for an instant, which a starting daemon's acquire() waits out."""
    try:
        fd = os.open(lock_path(socket), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # (releases the shared lock, when it was taken)
    return None


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0
