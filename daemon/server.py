"""The daemon's server: create_server() builds it, serve() runs it until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from trnsim.daemon import wire
from trnsim.daemon.config import (
    ConfigError,
    DaemonConfig,
    compile_scale,
    ensure_private_dir,
    socket_path,
    systemd_notify_socket,
    tcp_allowed,
)
from trnsim.daemon.pathlock import PathLock
from trnsim.daemon.service import CompileService, build_service

log = logging.getLogger(__name__)
SERVICE_NAME = wire.SERVICE


def _hold_path(path: Path, system: bool) -> PathLock:
    """The socket's directory, and the path's lock (PathHeld when another daemon has it):
    taken before anything slow (the cache's open may wait a minute on a locked database), so
    that a second daemon on the path refuses at once instead of binding over the first."""
    if system:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        ensure_private_dir(path.parent)
    return PathLock.acquire(path, 0o640 if system else 0o600)


def _check_socket(path: Path) -> None:
    """With the path's lock held: a socket file there is a dead daemon's (replaced when this
    one binds), unless a daemon of a version before the lock listens on it."""
    if path.exists() and _answers(path):
        raise ConfigError(f"a daemon already listens on {path}; stop it first (trnsim daemon stop)")


def _bind_unix(server: grpc.aio.Server, path: Path, mode: int) -> None:
    """Binds under a name of this process's own, then renames the socket onto path: gRPC
    unlinks the name it binds, at bind and again at shutdown, whatever file is there by
    then; this way the only name it ever unlinks is its own, and a dead daemon's socket at
    path is replaced in one step. (The socket is the same after the rename.)"""
    private = path.parent / f".bind-{os.getpid()}"
    server.add_insecure_port(f"unix:{private}")
    os.chmod(private, mode)
    os.replace(private, path)


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at path as (device, inode); None when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _remove_own_socket(path: Path, identity: tuple[int, int] | None) -> None:
    """Unlinks the socket this daemon bound, and nothing else: a file an operator (or a
    daemon of an older version) put at the path since is left in place."""
    if identity is not None and _identity(path) == identity:
        path.unlink(missing_ok=True)


def _answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


@dataclass
class Bound:
    """A daemon's server, bound and not yet started, with what it serves."""

    server: grpc.aio.Server
    address: str  # the address bound (a TCP port chosen when :0 was asked)
    service: CompileService
    health: health.aio.HealthServicer
    path_lock: PathLock | None = None  # held until the daemon has removed its socket
    socket_id: tuple[int, int] | None = None  # the socket file bound: removed at exit

    def release(self) -> None:
        """Removes the socket if it is still this server's, then lets the path go."""
        path = socket_path(self.address)
        if path is not None:
            _remove_own_socket(path, self.socket_id)
        if self.path_lock is not None:
            self.path_lock.release()


def create_server(
    address: str, config: DaemonConfig, service: CompileService | None = None
) -> Bound:
    """A bound, not yet started, asyncio server for address ("unix:/path" or "host:port"),
    serving `service` (by default build_service(config): the daemon's own cache and worker
    processes). Call from inside the event loop that will run it.

    A Unix socket's path is held (daemon/pathlock.py) from the start: another daemon on it
    raises PathHeld before this one opens its cache or binds. Bound.release() removes the
    socket and lets the path go."""
    path = socket_path(address)
    path_lock = _hold_path(path, config.system) if path is not None else None
    try:
        bound = _create_server(address, config, service)
    except BaseException:
        if path_lock is not None:
            path_lock.release()
        raise
    bound.path_lock = path_lock
    bound.socket_id = _identity(path) if path is not None else None
    return bound


def _create_server(address: str, config: DaemonConfig, service: CompileService | None) -> Bound:
    path = socket_path(address)
    if path is not None:
        _check_socket(path)
    elif not tcp_allowed() and not address.startswith(("localhost:", "127.0.0.1:", "[::1]:")):
        raise ConfigError(
            f"TCP address {address!r}: set TRNSIM_ALLOW_TCP=1 to listen beyond loopback"
        )
    config.address = address
    compile_scale()  # (a bad NEURON_SIM_COMPILE_SCALE stops the start, not every worker)
    if not config.cache_dir.exists():  # (an existing one, shared maybe, keeps its mode)
        with contextlib.suppress(OSError):  # (read-only, full: the cache logs its disk tier off)
            ensure_private_dir(config.cache_dir)
    service = service or build_service(config)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", 512 * 1024 * 1024),
            ("grpc.max_concurrent_streams", config.max_streams),
            # A second daemon on a TCP port fails to bind instead of sharing it (Linux's
            # SO_REUSEPORT, on by default in gRPC, would split the clients between them).
            ("grpc.so_reuseport", 0),
        ],
    )
    wire.register(server, service)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        if path is not None:
            _bind_unix(server, path, 0o660 if config.system else 0o600)
            return Bound(server, address, service, health_servicer)
        port = server.add_insecure_port(address)
    except RuntimeError as e:  # (gRPC's "Failed to bind": a port in use, a path too long)
        raise _cannot_listen(address) from e
    if port == 0:
        raise _cannot_listen(address)
    bound = f"{address.rsplit(':', 1)[0]}:{port}"
    return Bound(server, bound, service, health_servicer)


def _cannot_listen(address: str) -> ConfigError:
    return ConfigError(
        f"could not listen on {address}: in use by another process (a daemon? "
        f"`trnsim --address {address} daemon status`), or not an address of this host"
    )


def notify_systemd(message: str) -> None:
    """sd_notify(3): tells systemd (Type=notify) we are ready or stopping."""
    target = systemd_notify_socket()
    if not target:
        return
    if target.startswith("@"):
        target = "\0" + target[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(target)
        s.sendall(message.encode())


async def _serve(config: DaemonConfig) -> int:
    bound = create_server(config.address, config)
    try:
        return await _run(bound, config)
    finally:
        bound.release()  # (last: the path stays held until the socket is gone)


async def _run(bound: Bound, config: DaemonConfig) -> int:
    server, service, health_servicer = bound.server, bound.service, bound.health
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "trnsim compile daemon %s listening on %s (%d workers)",
        service.version,
        bound.address,
        config.workers,
    )
    notify_systemd("READY=1\nSTATUS=listening on " + bound.address)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.5)
        except TimeoutError:
            pass
        idle_for = time.monotonic() - service.last_activity
        if config.idle_exit_s is not None and service.idle() and idle_for >= config.idle_exit_s:
            log.info("idle for %.0f s with no client: exiting", idle_for)
            break
    notify_systemd("STOPPING=1")
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await loop.run_in_executor(None, service.drain, config.drain_timeout_s)
    service.end_streams()  # (every waiter has its answer: streams end with it, not cut)
    await server.stop(grace=2)
    service.close()
    return 0


def serve(config: DaemonConfig) -> int:
    """Runs until SIGTERM/SIGINT (drain, then stop) or, when idle_exit_s is set, until idle."""
    _return_large_frees()
    return asyncio.run(_serve(config))


M_MMAP_THRESHOLD = -3  # mallopt(3)
MMAP_THRESHOLD_BYTES = 1 << 20


def _return_large_frees() -> None:
    """Buffers of 1 MiB and more are mapped apart, so that freeing them gives the memory back
    to the system. A large executable passes through several temporary copies (the worker's
    pipe, the parsed result, the bytes for disk, one answer per waiter); glibc's default
    raises its threshold after the first large free and keeps such copies in the heap: a
    22 MB executable left the daemon 44 MB above what its memory tier holds, and 0 MB with
    this. (glibc only; elsewhere nothing changes.)"""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def serve_in_foreground(config: DaemonConfig) -> int:
    """serve() as a process's one job (`trnsim daemon serve`, `python -m trnsim.daemon`): its
    log goes to stderr (daemon.log next to the socket, for a daemon a client started)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(config)
