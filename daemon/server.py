"""The daemon's server: create_server() for tests and embedding, serve() for the process."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from trnsim.daemon.config import ConfigError, DaemonConfig, ensure_private_dir, socket_path
from trnsim.daemon.service import CompileService
from trnsim.protos import compile_service_pb2_grpc as svc_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "trnsim.service.CompileService"


def _prepare_socket(path: Path, system: bool) -> None:
    if system:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        ensure_private_dir(path.parent)
    if path.exists():
        if _answers(path):
            raise ConfigError(
                f"a daemon already listens on {path}; stop it first (trnsim daemon stop)"
            )
        path.unlink()  # a stale socket from a daemon that died


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


def create_server(
    address: str, config: DaemonConfig
) -> tuple[grpc.Server, str, CompileService, health.HealthServicer]:
    """A started-ready (not yet started) server bound to address ("unix:/path" or "host:port")."""
    path = socket_path(address)
    if path is not None:
        _prepare_socket(path, config.system)
    elif (
        not config.system
        and os.environ.get("TRNSIM_ALLOW_TCP") != "1"
        and not address.startswith(("localhost:", "127.0.0.1:", "[::1]:"))
    ):
        raise ConfigError(
            f"TCP address {address!r}: set TRNSIM_ALLOW_TCP=1 to listen beyond loopback"
        )
    config.address = address
    ensure_private_dir(config.cache_dir)
    service = CompileService(config)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_streams + 16, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", 512 * 1024 * 1024),
            ("grpc.max_concurrent_streams", config.max_streams),
        ],
    )
    svc_grpc.add_CompileServiceServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if path is None and port == 0:
        raise ConfigError(f"could not listen on {address}")
    bound = address if path is not None else f"{address.rsplit(':', 1)[0]}:{port}"
    if path is not None:
        os.chmod(path, 0o660 if config.system else 0o600)  # set before anyone can be served
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, service, health_servicer


def notify_systemd(message: str) -> None:
    """sd_notify(3): tells systemd (Type=notify) we are ready or stopping."""
    target = os.environ.get("NOTIFY_SOCKET")
    if not target:
        return
    if target.startswith("@"):
        target = "\0" + target[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(target)
        s.sendall(message.encode())


def serve(config: DaemonConfig) -> int:
    """Runs until SIGTERM/SIGINT (drain, then stop) or, when idle_exit_s is set, until idle."""
    server, bound, service, health_servicer = create_server(config.address, config)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    socket_file = socket_path(bound)
    if socket_file is not None:
        os.chmod(socket_file, 0o660 if config.system else 0o600)
    log.info(
        "trnsim compile daemon %s listening on %s (%d workers)",
        service.version,
        bound,
        config.workers,
    )
    notify_systemd("READY=1\nSTATUS=listening on " + bound)
    idle_since = time.monotonic()
    while not stop.wait(0.5):
        if config.idle_exit_s is None:
            continue
        if not service.idle() or time.monotonic() - service.last_activity < config.idle_exit_s:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= 0:
            log.info("idle for %.0f s with no client: exiting", config.idle_exit_s)
            break
    notify_systemd("STOPPING=1")
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    service.drain(config.drain_timeout_s)
    server.stop(grace=2).wait()
    service.close()
    if socket_file is not None and socket_file.exists():
        socket_file.unlink()
    return 0
