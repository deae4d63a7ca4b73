"""Finding the daemon, and starting one when none answers (one process wins the race)."""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from trnsim.daemon import pathlock, wire
from trnsim.daemon.config import ConfigError, default_address, ensure_private_dir, socket_path
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc

AUTO_IDLE_EXIT_S = 600.0
_SPAWNED: list[subprocess.Popen[bytes]] = []


@atexit.register
def _detach_spawned() -> None:
    """Daemons this process started outlive it by design: not a leaked child."""
    for proc in _SPAWNED:
        if proc.poll() is None:
            proc.returncode = 0


class UntrustedDaemon(ConfigError):
    """Unrecoverable for this address: what listens there (or the directory it listens in)
    is not this user's daemon; compiles stay in process. The message says what to fix."""


def check_trusted(address: str) -> None:
    """Before a single byte is sent: a Unix socket's directory must be a real directory that
    only its owner can write, owned by this user or created under a root-only directory (a
    systemd RuntimeDirectory), and the process listening must run as that owner, this user
    or root. A name in the shared temp directory that another user created first fails."""
    path = socket_path(address)
    if path is None:
        return  # a TCP address is named by the user, who chose to trust it
    owner = _trusted_dir(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (owner, os.getuid(), 0):
        raise UntrustedDaemon(f"{path} is not a socket of this user's daemon (uid {st.st_uid})")
    uid = peer_uid(path)
    if uid is not None and uid not in (owner, os.getuid(), 0):
        raise UntrustedDaemon(
            f"the process listening on {path} runs as uid {uid}, not as you; it is not your "
            f"compile daemon (remove {path.parent} or set XDG_RUNTIME_DIR)"
        )


def _trusted_dir(directory: Path) -> int:
    """The uid that owns a trustworthy socket directory; raises UntrustedDaemon otherwise."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return os.getuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedDaemon(f"{directory} is not a real directory (a symbolic link?)")
    if st.st_mode & 0o022:
        raise UntrustedDaemon(
            f"{directory} can be written by other users (mode {st.st_mode & 0o777:o})"
        )
    if st.st_uid in (os.getuid(), 0):
        return st.st_uid
    parent = os.lstat(directory.parent)
    if parent.st_uid == 0 and not parent.st_mode & 0o022:
        return st.st_uid  # only root could create it there: a system daemon's directory
    raise UntrustedDaemon(
        f"{directory} belongs to uid {st.st_uid}, not to you: another user may have created it "
        f"to intercept your compiles; remove it or set XDG_RUNTIME_DIR"
    )


@dataclass(frozen=True)
class Listener:
    """The process listening on a Unix socket, as the kernel saw it call listen()."""

    pid: int
    uid: int


def listener(path: Path) -> Listener | None:
    """Who listens on a Unix socket (SO_PEERCRED), None if nobody does. The kernel answers
    for the listener, so it works for a daemon that is stopped and accepts nothing."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid, uid, _gid = struct.unpack("3i", creds)
    return Listener(int(pid), int(uid))


def stopped(address: str) -> bool:
    """Whether the process listening at a Unix-socket address is stopped (SIGSTOP, a
    debugger: state T or t in /proc): it answers nothing until continued. False for a TCP
    address, nobody listening, or a process that runs, however slowly (a loaded daemon)."""
    path = socket_path(address)
    peer = listener(path) if path is not None else None
    return peer is not None and process_state(peer.pid) == "stopped"


def peer_uid(path: Path) -> int | None:
    """The uid of the process listening on a Unix socket (SO_PEERCRED), None if none does."""
    peer = listener(path)
    return None if peer is None else peer.uid


_STATES = {"R": "running", "S": "sleeping", "D": "waiting on disk", "T": "stopped"}


def process_state(pid: int) -> str:
    """What the kernel says a process is doing (/proc/PID/stat): "stopped" for one that got
    SIGSTOP, "running", "sleeping"...; "" when it cannot be read."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat_line[stat_line.rfind(")") + 2 :].split()  # (the name may hold spaces)
    code = fields[0] if fields else ""
    return _STATES.get(code.upper() if code == "t" else code, code)


class DaemonNotAnswering(RuntimeError):
    """Recoverable: a process listens on the daemon's address but did not answer within the
    deadline: stopped (SIGSTOP), swapped out, or its event loop wedged. Compiles go in
    process meanwhile, and the address is asked again later; it is never a reason to start
    a second daemon (that one could not bind the address anyway)."""

    def __init__(self, address: str, seconds: float, pid: int | None) -> None:
        self.address = address
        self.seconds = seconds
        self.pid = pid
        state = process_state(pid) if pid is not None else ""
        who = f"pid {pid}" + (f", {state}" if state else "") if pid is not None else "it"
        super().__init__(
            f"the compile daemon at {address} ({who}) holds the address but did not answer "
            f"within {seconds:g} s"
        )


# How long GetInfo may take. A socket nobody listens on fails at once; a daemon that is
# there but loaded (64 processes starting together on 2 cores) can take seconds, and taking
# it for absent would mean compiling in process, or starting a second daemon.
INFO_TIMEOUT_S = 10.0


def get_info(
    address: str, timeout: float = INFO_TIMEOUT_S, version: str = "", fmt: int = 0
) -> svc.GetInfoResponse | None:
    """The daemon's GetInfo answer, or None when nothing answers at address. Raises
    UntrustedDaemon when what answers there is not this user's (check_trusted)."""
    path = socket_path(address)
    if path is not None and not path.exists():
        return None
    check_trusted(address)
    channel = grpc.insecure_channel(address)
    try:
        stub = svc_grpc.CompileServiceStub(channel)
        return stub.GetInfo(  # type: ignore[no-any-return]
            svc.GetInfoRequest(client_compiler_version=version, client_format_version=fmt),
            timeout=timeout,
        )
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def probe(
    address: str, timeout: float, version: str = "", fmt: int = 0
) -> svc.GetInfoResponse | None:
    """get_info() that tells, within `timeout`, a daemon that does not answer from one that
    is slow: GetInfo is sent with a health check beside it. A daemon whose health check
    answers in time is alive, if loaded, and gets INFO_TIMEOUT_S for GetInfo; one whose
    health check does not, and whose process is stopped (SIGSTOP), raises
    DaemonNotAnswering after `timeout`, and nothing is started beside it. One that runs but
    did not answer the health check in time (64 clients starting at once on 2 cores) is
    loaded, not hung: it gets INFO_TIMEOUT_S too, then DaemonNotAnswering if GetInfo has
    no answer by then (a wedged event loop). None when nothing listens at address."""
    path = socket_path(address)
    if path is not None and not path.exists():
        return None
    check_trusted(address)
    request = svc.GetInfoRequest(client_compiler_version=version, client_format_version=fmt)
    with grpc.insecure_channel(address) as channel:
        info = svc_grpc.CompileServiceStub(channel).GetInfo.future(request, timeout=INFO_TIMEOUT_S)
        check = health_pb2_grpc.HealthStub(channel).Check.future(HEALTH_REQUEST, timeout=timeout)
        either = threading.Event()
        info.add_done_callback(lambda _: either.set())
        check.add_done_callback(lambda _: either.set())
        either.wait()
        if not info.done() and _silent(check) and (path is None or stopped(address)):
            info.cancel()
            peer = listener(path) if path is not None else None
            if path is None or peer is not None:
                raise DaemonNotAnswering(address, timeout, peer.pid if peer else None)
            return None  # (it went away while we asked)
        try:
            return info.result()  # type: ignore[no-any-return]
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return None
        peer = listener(path) if path is not None else None
        if path is None or peer is not None:  # it listens and said nothing in INFO_TIMEOUT_S
            raise DaemonNotAnswering(address, INFO_TIMEOUT_S, peer.pid if peer else None)
        return None


HEALTH_REQUEST = health_pb2.HealthCheckRequest(service=wire.SERVICE)


def _silent(check: grpc.Future) -> bool:
    """Whether a health check went unanswered: any answer (NOT_SERVING while the daemon
    drains, UNIMPLEMENTED from a server without the health service) shows it alive."""
    error = check.exception()
    return isinstance(error, grpc.RpcError) and bool(
        error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    )


def answers_health_check(channel: grpc.Channel, timeout: float) -> bool:
    """Whether the daemon on `channel` answers a health check within `timeout` (any answer
    counts, as in probe())."""
    try:
        health_pb2_grpc.HealthStub(channel).Check(HEALTH_REQUEST, timeout=timeout)
    except grpc.RpcError as e:
        return bool(e.code() != grpc.StatusCode.DEADLINE_EXCEEDED)
    return True


def spawn(
    address: str, idle_exit_s: float | None, log_file: Path | None = None
) -> subprocess.Popen[bytes]:
    """Starts `python -m trnsim.daemon` detached from this process's session."""
    cmd = [sys.executable, "-m", "trnsim.daemon", "--address", address]
    if idle_exit_s is not None:
        cmd += ["--idle-exit", str(idle_exit_s)]
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    with open(log_file or os.devnull, "ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    _SPAWNED.append(proc)  # outlives this call on purpose: not reaped or warned about here
    return proc


def replace_daemon(
    address: str, info: svc.GetInfoResponse, wait_s: float = 30.0
) -> svc.GetInfoResponse | None:
    """Stops the daemon answering at address (when it is this user's, on a Unix socket) and
    starts a fresh one: how an auto-started daemon of an older installation is upgraded."""
    path = socket_path(address)
    if path is None or not _owned_by_me(info.pid):
        return info
    try:
        os.kill(info.pid, signal.SIGTERM)  # drains: its running compiles finish first
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (
        get_info(address, timeout=0.3) is not None or pathlock.held_by(path) == info.pid
    ):
        time.sleep(0.05)  # (until it has let the path go: it removes its socket first)
    return ensure_daemon(address)


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


# How long ensure_daemon waits for a daemon it started (or found starting) to answer. A
# daemon whose cache is locked (a long `trnsim cache verify`) may take a minute: the caller
# then compiles in process meanwhile and asks again later, and no second daemon is started,
# because the first holds its path (daemon/pathlock.py) from its first instant.
START_WAIT_S = 15.0


def ensure_daemon(
    address: str | None = None,
    wait_s: float = START_WAIT_S,
    idle_exit_s: float | None = AUTO_IDLE_EXIT_S,
    info_timeout: float = INFO_TIMEOUT_S,
) -> svc.GetInfoResponse | None:
    """Connects to the daemon at address, starting one if none holds its path. Concurrent
    callers start one daemon: the first to take the lock file next to the socket starts it,
    and everyone waits (up to wait_s) for the daemon that holds the path to answer. None: a
    daemon is there but does not answer yet (starting on a slow cache); ask again later.
    DaemonNotAnswering, and nothing started: a process listens at address but does not
    answer within `info_timeout` (hung). DaemonStartError: the started daemon exited, for
    its own reason."""
    address = address or default_address()
    info = probe(address, info_timeout)
    path = socket_path(address)
    if info is not None or path is None:
        return info  # (a TCP daemon is started by its operator, not by clients)
    ensure_private_dir(path.parent)
    # probe raised for a daemon that listens and does not answer (hung). None with the path
    # held is one that is binding its socket as we asked (refused): wait for it below.
    deadline = time.monotonic() + wait_s
    started: _Started | None = None
    while time.monotonic() < deadline:
        if pathlock.held_by(path) is not None:
            info = get_info(address, timeout=0.5)
            if info is not None:
                return info
        elif started is not None and started.failed():
            raise started.error()  # it exited for its own reason, and nobody holds the path
        elif started is None or started.proc.poll() is not None:
            started = _start_unless_held(address, path, idle_exit_s, deadline) or started
        time.sleep(0.05)
    return None


@dataclass
class _Started:
    """A daemon this call started, and where its log began."""

    proc: subprocess.Popen[bytes]
    log_file: Path
    log_start: int

    def failed(self) -> bool:
        """It exited, and not because another daemon holds the path."""
        return self.proc.poll() not in (None, pathlock.EXIT_PATH_HELD)

    def error(self) -> DaemonStartError:
        status = self.proc.returncode
        return DaemonStartError(status, _last_line(self.log_file, self.log_start), self.log_file)


def _start_unless_held(
    address: str, path: Path, idle_exit_s: float | None, deadline: float
) -> _Started | None:
    """Under the launcher's lock (compiler.lock): starts a daemon unless one holds the path,
    and keeps the lock until the new daemon holds the path itself or has exited, so that no
    other caller starts one while this one is still importing."""
    with open(path.parent / "compiler.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the winner starts it; the others wait here
        if pathlock.held_by(path) is not None:
            return None
        log_file = path.parent / "daemon.log"
        start = log_file.stat().st_size if log_file.exists() else 0
        proc = spawn(address, idle_exit_s, log_file)
        while time.monotonic() < deadline and proc.poll() is None:
            if pathlock.held_by(path) is not None:
                break
            time.sleep(0.02)
        return _Started(proc, log_file, start)


class DaemonStartError(ConfigError):
    """The auto-started daemon exited before it answered: its own reason (a cache directory
    open to other users, a port taken...) is in its log, and said here."""

    def __init__(self, status: int, reason: str, log_file: Path) -> None:
        super().__init__(
            f"the compile daemon exited at start (status {status}): "
            f"{reason or 'no reason given'} (log: {log_file})"
        )


def _last_line(log_file: Path, start: int) -> str:
    """The last line the daemon wrote to its log from byte `start` on."""
    try:
        with open(log_file, "rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""
