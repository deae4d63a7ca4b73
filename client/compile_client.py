"""How the runtime gets executables: one interface, two transports. In process (the
baseline, and the fallback) and the per-host daemon over one gRPC stream per process."""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Protocol

import grpc
from trnsim import compiler
from trnsim.client import env
from trnsim.daemon import launcher
from trnsim.daemon.cache import blob_ok
from trnsim.daemon.config import default_address
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos import executable_pb2, graph_pb2

log = logging.getLogger(__name__)
RECONNECT_AFTER_S = 5.0
# Errors that mean "the daemon could not do it", not "this graph cannot be compiled".
_COMPILE_HERE = {svc.VERSION_MISMATCH, svc.CANCELLED, svc.TRANSIENT, svc.TIMEOUT}


class CompileClient(Protocol):
    def compile(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
    ) -> executable_pb2.Executable: ...

    def close(self) -> None:
        """Releases what the client holds (the daemon stream); compiles still work after."""


class InProcessCompileClient:
    """Compiles in this process: the baseline, and the fallback when no daemon answers."""

    def __init__(self) -> None:
        self.compiles = 0

    def compile(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
    ) -> executable_pb2.Executable:
        self.compiles += 1
        return compiler.compile(graph, target, options, debug)

    def close(self) -> None:
        pass


class DaemonUnavailable(RuntimeError):
    """Recoverable: the daemon cannot be reached; the client compiles in process for now."""


class DaemonCompileClient:
    """Requests go over one bidirectional stream; each gets a future, answered out of order.

    If the daemon cannot be reached, dies mid-run or is another version, compiles happen in
    this process (warned once) and the client tries to reconnect later: no training step
    fails because of the daemon.
    """

    def __init__(self, address: str, auto_start: bool) -> None:
        self.address = address
        self.auto_start = auto_start
        self.local = InProcessCompileClient()
        self.version = compiler.compiler_version()
        self.requests = 0
        self.fallbacks = 0
        self.tiers: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, Future[svc.CompileResult]] = {}
        self._outbox: queue.Queue[svc.CompileRequest | None] | None = None
        self._channel: grpc.Channel | None = None
        self._retry_at = 0.0
        self._warned = False

    # -- the interface ------------------------------------------------------------------------------
    def compile(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
        priority: int = svc.BLOCKING,
    ) -> executable_pb2.Executable:
        request = compile_request(
            graph, target, options, debug, background=priority == svc.BACKGROUND
        )
        try:
            result = self.submit(request).result()
        except DaemonUnavailable as e:
            return self._compile_here(graph, target, options, debug, str(e))
        outcome = result.WhichOneof("outcome")
        if outcome == "error":
            if result.error.error_class in _COMPILE_HERE:
                return self._compile_here(graph, target, options, debug, result.error.message)
            if result.error.error_class == svc.OUT_OF_DEVICE_MEMORY:
                raise compiler.GraphTooLargeError(result.error.message)
            raise compiler.CompileError(result.error.message)
        exe = self._executable(result.executable)
        if exe is None:
            return self._compile_here(
                graph, target, options, debug, "the daemon sent a damaged executable"
            )
        tier = svc.CacheTier.Name(result.tier)
        self.tiers[tier] = self.tiers.get(tier, 0) + 1
        return exe

    def submit(self, request: svc.CompileRequest) -> Future[svc.CompileResult]:
        """Sends a request on the stream; the future fails with DaemonUnavailable if the
        daemon cannot be reached or the stream breaks before the answer."""
        future: Future[svc.CompileResult] = Future()
        with self._lock:
            outbox = self._connect()
            if outbox is None:
                future.set_exception(DaemonUnavailable(f"no compile daemon at {self.address}"))
                return future
            request.id = next(self._ids)
            self._pending[request.id] = future
            self.requests += 1
        outbox.put(request)
        return future

    # -- the stream -------------------------------------------------------------------------------
    def _connect(self) -> queue.Queue[svc.CompileRequest | None] | None:
        if self._outbox is not None:
            return self._outbox
        if time.monotonic() < self._retry_at:
            return None
        self._retry_at = time.monotonic() + RECONNECT_AFTER_S
        if self.auto_start:
            info = launcher.ensure_daemon(self.address)
            if info is not None and not _same_version(info, self.version):
                # The user's own auto-started daemon from an older installation: replace it
                # (its clients fall back to compiling in process meanwhile; nothing fails).
                info = launcher.replace_daemon(self.address, info)
        else:
            info = launcher.get_info(
                self.address, version=self.version, fmt=compiler.FORMAT_VERSION
            )
        if info is None:
            return None
        if not _same_version(info, self.version):
            self._warn(
                f"the compile daemon at {self.address} runs compiler {info.compiler_version}, this "
                f"process {self.version}: compiling in process (restart the daemon to share it)"
            )
            self._retry_at = float("inf")
            return None
        self._channel = grpc.insecure_channel(self.address)
        outbox: queue.Queue[svc.CompileRequest | None] = queue.Queue()
        responses = svc_grpc.CompileServiceStub(self._channel).Compile(self._requests(outbox))
        threading.Thread(
            target=self._read, args=(responses,), name="trnsim-compile-stream", daemon=True
        ).start()
        self._outbox = outbox
        return outbox

    @staticmethod
    def _requests(outbox: queue.Queue[svc.CompileRequest | None]):  # type: ignore[no-untyped-def]
        while True:
            request = outbox.get()
            if request is None:
                return
            yield request

    def _read(self, responses: grpc.Future) -> None:
        try:
            for result in responses:
                with self._lock:
                    future = self._pending.pop(result.id, None)
                if future is not None:
                    future.set_result(result)
        except grpc.RpcError as e:
            log.debug("compile stream ended: %s", e)
        self._lost("the compile daemon went away")

    def _lost(self, why: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            if self._outbox is not None:
                self._outbox.put(None)
            self._outbox = None
            channel, self._channel = self._channel, None
            self._retry_at = time.monotonic() + RECONNECT_AFTER_S
        for future in pending.values():
            future.set_exception(DaemonUnavailable(why))
        if channel is not None:
            channel.close()

    # -- helpers ------------------------------------------------------------------------------------
    def _executable(self, blob: svc.ExecutableBlob) -> executable_pb2.Executable | None:
        if not blob_ok(blob):
            return None
        exe = executable_pb2.Executable.FromString(blob.data)
        if exe.format_version != compiler.FORMAT_VERSION or exe.compiler_version != self.version:
            return None
        return exe

    def _compile_here(
        self,
        graph: graph_pb2.Graph,
        target: str,
        options: executable_pb2.CompileOptions,
        debug: graph_pb2.GraphDebug | None,
        why: str,
    ) -> executable_pb2.Executable:
        self.fallbacks += 1
        self._warn(f"compiling in process: {why}")
        return self.local.compile(graph, target, options, debug)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"trnsim: {message}", RuntimeWarning, stacklevel=4)
        log.info("trnsim: %s", message)

    def close(self) -> None:
        self._lost("closed")


def _same_version(info: svc.GetInfoResponse, version: str) -> bool:
    return info.compiler_version == version and info.format_version == compiler.FORMAT_VERSION


def compile_request(
    graph: graph_pb2.Graph,
    target: str,
    options: executable_pb2.CompileOptions,
    debug: graph_pb2.GraphDebug | None,
    background: bool = False,
) -> svc.CompileRequest:
    request = svc.CompileRequest(
        priority=svc.BACKGROUND if background else svc.BLOCKING,
        graph=graph,
        target=target,
        options=options,
        compiler_version=compiler.compiler_version(),
        format_version=compiler.FORMAT_VERSION,
    )
    if debug is not None:
        request.debug.CopyFrom(debug)
    return request


def make_client() -> CompileClient:
    """NEURON_COMPILE_DAEMON: unset/auto = the host's daemon (started if none answers),
    off = in process, anything else = that daemon's address."""
    setting = os.environ.get(env.NEURON_COMPILE_DAEMON, "auto").strip() or "auto"
    if setting == "off":
        return InProcessCompileClient()
    if setting == "auto":
        return DaemonCompileClient(default_address(), auto_start=True)
    address = setting if setting.startswith("unix:") or ":" in setting else f"unix:{setting}"
    return DaemonCompileClient(address, auto_start=False)
