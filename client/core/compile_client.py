"""How the runtime gets executables: one interface, two transports. In process (the
baseline, and the fallback) and the per-host daemon over one gRPC stream per process."""

from __future__ import annotations

import atexit
import contextlib
import enum
import functools
import itertools
import logging
import queue
import threading
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from trnsim import compiler
from trnsim.client.core import env
from trnsim.client.core.daemon_health import Backoff, Watchdog
from trnsim.client.core.direct_reads import DirectReads
from trnsim.compiler.compile_time import burn
from trnsim.daemon import launcher
from trnsim.daemon.config import ConfigError, check_private_dir, default_address
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.protos.blobs import executable_of
from trnsim.simulator.config import get_target

log = logging.getLogger(__name__)
RECONNECT_AFTER_S = 2.0  # first retry of a daemon that could not be reached; doubles up to 60 s
# How long the daemon has to show it is alive (NEURON_COMPILE_HEALTH_DEADLINE): a hung one
# costs a waiting compile about twice this, then compiles go in process until it answers.
HEALTH_DEADLINE_S = env.health_deadline_s()
LOOKUP_DEADLINE_S = 2.0  # adaptive mode asking the cache for a graph met the first time
NEAREST_DEADLINE_S = 10.0  # torch.neuron.explain() asking which cached keys are nearest
MAX_ANSWER_BYTES = 512 * 1024 * 1024  # the daemon's own send limit (daemon/server.py)
# Executables read from the daemon's disk tier are reported to it (Touch: their last use, for
# its LRU eviction) this long after the first of them, in one message, by a timer thread.
TOUCH_AFTER_S = 0.5
MAX_TOUCH_KEYS = 10_000  # the daemon's limit per Touch
# How long a blocking compile waits for the answer of a daemon that is alive (it answers its
# health checks) before compiling in process: a safety net against a daemon that answers
# everything but this request (every request is answered). Past the daemon's own compile
# limit (600 s, daemon/config.py) with a margin, so a slow graph gets the daemon's TIMEOUT
# rather than a second compile here.
ANSWER_DEADLINE_S = env.compile_deadline_s()
# Errors that mean "the daemon could not do it", not "this graph cannot be compiled". A
# TIMEOUT is not among them: the graph ran over the daemon's limit, and compiling it here
# would hold this process as long.
_COMPILE_HERE = {svc.VERSION_MISMATCH, svc.CANCELLED, svc.TRANSIENT, svc.UNKNOWN_OP}


@dataclass(frozen=True, eq=False)
class CompileJob:
    """One compile to ask for: the graph, the target it runs on, the options it compiles at,
    and its source lines (never part of the key). Its cache key is computed once, when first
    asked for: the in-process cache files the executable under it, and a daemon's answer
    must be for it."""

    graph: graph_pb2.Graph
    target: str
    options: executable_pb2.CompileOptions
    debug: graph_pb2.GraphDebug | None = None

    @functools.cached_property
    def key(self) -> str:
        """The cache key (compiler/keys.py) this process computes for the graph."""
        target = get_target(self.target)
        return compiler.cache_key_from_proto(self.graph, target, self.options).digest


class Tier(enum.Enum):
    """Where a compile's executable came from."""

    IN_PROCESS = enum.auto()  # compiled in this process (no daemon, or its fallback)
    MEMORY = enum.auto()  # the daemon's memory tier
    DISK = enum.auto()  # the daemon's disk tier
    REMOTE = enum.auto()  # the cluster tier behind the daemon (another host compiled it)
    DIRECT = enum.auto()  # the daemon's disk tier, read by this process itself
    COMPILED = enum.auto()  # the daemon compiled it for this request
    JOINED = enum.auto()  # the request joined the daemon's compile already in flight
    UNSPECIFIED = enum.auto()  # a daemon that did not say


_TIERS = {
    svc.MEMORY: Tier.MEMORY,
    svc.DISK: Tier.DISK,
    svc.REMOTE: Tier.REMOTE,
    svc.COMPILED: Tier.COMPILED,
    svc.JOINED: Tier.JOINED,
}


@dataclass(frozen=True)
class Compiled:
    """A compile's answer to one request: the executable (the cacheable artifact, the same
    for every requester), and what is this request's own: the modelled compile seconds it
    waited for (all of a compile it started, the rest of one it joined, none for a cache
    hit) and where the executable came from."""

    executable: executable_pb2.Executable
    waited_seconds: float
    tier: Tier

    @property
    def fetched(self) -> bool:
        """A cache hit: it waited for no compile (compiled by an earlier run, another process
        or `trnsim precompile`)."""
        return self.waited_seconds == 0 and self.executable.modelled_compile_seconds > 0


class CompileClient(Protocol):
    def compile(self, job: CompileJob) -> Compiled: ...

    def compile_async(self, job: CompileJob) -> Future[Compiled]:
        """A background compile (adaptive mode's fused graphs): its answer, or the compile's
        error, when it is done."""
        ...

    @property
    def shared(self) -> bool:
        """Whether compiles land in a cache other processes share (asking is then cheap)."""
        ...

    def close(self) -> None:
        """Releases what the client holds (the daemon stream); compiles still work after."""

    def nearest(self, missed: list[Parts]) -> list[Parts | None] | None:
        """For each missed (key, parts), the key cached before it that is nearest to it, and
        its parts (None: nothing to compare with); None without a shared cache to ask."""

    def cached(self, key: str) -> Compiled | None:
        """The executable of `key` if a shared cache holds it (never compiles; it waited for
        nothing): None on a miss or without a shared cache."""

    def read(self, keys: list[str]) -> dict[str, Compiled]:
        """The executables of `keys` a shared cache holds, read in one go without compiling
        (a key missing from the answer is not there): {} without a shared cache."""


# A cache key and its parts (compiler/keys.py key_parts): what explaining a miss compares.
Parts = tuple[str, list[compiler.KeyPart]]


class InProcessCompileClient:
    """Compiles in this process: the baseline, and the fallback when no daemon answers."""

    shared = False

    def __init__(self) -> None:
        self.compiles = 0
        self.scale = env.compile_scale()
        self._background: ThreadPoolExecutor | None = None

    def compile(self, job: CompileJob, background: bool = False) -> Compiled:
        """Compiled here: this process waits for all of its modelled compile time, and burns
        NEURON_SIM_COMPILE_SCALE x that of CPU (at the lowest priority for a background one)."""
        self.compiles += 1
        exe = compiler.compile(job.graph, job.target, job.options, job.debug)
        burn(exe.modelled_compile_seconds * self.scale, background)
        return Compiled(exe, exe.modelled_compile_seconds, Tier.IN_PROCESS)

    def compile_async(self, job: CompileJob) -> Future[Compiled]:
        """On one background thread (the compiler is pure Python: more would only contend)."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="trnsim-compile")
        return self._background.submit(self.compile, job, True)

    def close(self) -> None:
        if self._background is not None:
            self._background.shutdown(wait=False, cancel_futures=True)
            self._background = None

    def nearest(self, missed: list[Parts]) -> list[Parts | None] | None:
        return None  # (no cache but this process's: torch.neuron.explain() compares those)

    def cached(self, key: str) -> Compiled | None:
        return None

    def read(self, keys: list[str]) -> dict[str, Compiled]:
        return {}


class DaemonUnavailable(RuntimeError):
    """Recoverable: the daemon cannot be reached; the client compiles in process for now."""


class DaemonCompileClient:
    """Requests go over one bidirectional stream; each gets a future, answered out of order.

    If the daemon cannot be reached, dies mid-run, stops answering (a watchdog asks a silent
    daemon's health, HEALTH_DEADLINE_S) or is another version, compiles happen in this
    process (warned once) and the client tries to reconnect later, backing off: no training
    step fails, or waits out a hang, because of the daemon.
    """

    def __init__(self, address: str, auto_start: bool, direct_reads: bool | None = None) -> None:
        self.address = address
        self.auto_start = auto_start
        # Cache hits read from the daemon's disk tier here (NEURON_COMPILE_DIRECT_READS)
        self.direct_reads = env.direct_reads() if direct_reads is None else direct_reads
        self.local = InProcessCompileClient()
        self.version = compiler.compiler_version()
        self.requests = 0
        self.fallbacks = 0
        self.tiers: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._backoff = Backoff()
        self._warned = False
        self._disk: DirectReads | None = None  # the daemon's disk tier, read here
        self._touch_timer: threading.Timer | None = None

    # -- the interface ------------------------------------------------------------------------------
    def compile(self, job: CompileJob, priority: int = svc.BLOCKING) -> Compiled:
        compiled = self._hit(job)
        if compiled is None:
            compiled = self._ask(job, priority)
        if job.debug is not None and job.options.emit_debug_info:
            # ours: the daemon never shares one client's
            compiled.executable.debug.graph.CopyFrom(job.debug)
        return compiled

    def _ask(self, job: CompileJob, priority: int) -> Compiled:
        """The daemon's answer (a hit in its memory, a join, a compile), or compiled here."""
        request = compile_request(job, background=priority == svc.BACKGROUND)
        future = self.submit(request)
        try:
            result = future.result(timeout=ANSWER_DEADLINE_S)
        except DaemonUnavailable as e:
            return self._compile_here(job, str(e))
        except FutureTimeout:
            self.cancel(request.id)
            why = f"the compile daemon did not answer within {ANSWER_DEADLINE_S:.0f} s"
            return self._compile_here(job, why)
        compiled = self._answer(result, job.key)
        if isinstance(compiled, str):
            return self._compile_here(job, compiled)
        return compiled

    shared = True

    def compile_async(self, job: CompileJob) -> Future[Compiled]:
        """At BACKGROUND priority: the daemon runs it after every blocking compile. If the
        daemon cannot be reached, it compiles here in the background instead."""
        out: Future[Compiled] = Future()
        try:
            key = job.key
        except Exception as e:  # noqa: BLE001  (a malformed graph: its error, as in process)
            out.set_exception(e)
            return out
        hit = self._hit(job)
        if hit is not None:
            out.set_result(hit)
            return out

        def here(why: str) -> None:
            self.fallbacks += 1
            self._warn(f"compiling in process: {why}")
            local = self.local.compile_async(job)
            local.add_done_callback(lambda g: _pass_on(g, out))

        def answered(f: Future[svc.CompileResult]) -> None:
            try:
                compiled = self._answer(f.result(), key)
            except DaemonUnavailable as e:
                here(str(e))
            except Exception as e:  # noqa: BLE001  (cancelled, or the graph's error)
                out.set_exception(e)
            else:
                if isinstance(compiled, str):
                    here(compiled)
                else:
                    out.set_result(compiled)

        self.submit(compile_request(job, background=True)).add_done_callback(answered)
        return out

    def _answer(self, result: svc.CompileResult, key: str) -> Compiled | str:
        """The answer's executable and this request's wait for it; or why to compile here
        instead (the daemon could not do it, or sent a damaged or wrong executable); or the
        graph's own error, raised."""
        if result.WhichOneof("outcome") == "error":
            if result.error.error_class in _COMPILE_HERE:
                return result.error.message or svc.ErrorClass.Name(result.error.error_class)
            if result.error.error_class == svc.OUT_OF_DEVICE_MEMORY:
                raise compiler.GraphTooLargeError(result.error.message)
            raise compiler.CompileError(result.error.message)
        exe = self.executable(result, key)
        if exe is None:
            return "the daemon sent a damaged or wrong executable"
        return Compiled(exe, result.modelled_seconds_waited, self._tier(result.tier))

    def _tier(self, tier: svc.CacheTier) -> Tier:
        """Counts the daemon's tier of an answer (client.tiers, by the daemon's names)."""
        name = svc.CacheTier.Name(tier)
        self.tiers[name] = self.tiers.get(name, 0) + 1
        return _TIERS.get(tier, Tier.UNSPECIFIED)

    def cancel(self, request_id: int) -> None:
        """Withdraws a request: the daemon drops its part in the job (and the job, if no one
        else waits for it)."""
        with self._lock:
            stream = self._stream
            future = stream.pending.pop(request_id, None) if stream is not None else None
        if future is not None:
            future.cancel()
        if stream is not None:
            stream.outbox.put(svc.CompileRequest(id=request_id, cancel=True))

    def submit(self, request: svc.CompileRequest) -> Future[svc.CompileResult]:
        """Sends a request on the stream; the future fails with DaemonUnavailable if the
        daemon cannot be reached, the stream breaks or the daemon stops answering before
        the answer."""
        future: Future[svc.CompileResult] = Future()
        with self._lock:
            stream = self._connect()
            if stream is None:
                future.set_exception(DaemonUnavailable(f"no compile daemon at {self.address}"))
                return future
            request.id = next(self._ids)
            stream.pending[request.id] = future
            self.requests += 1
        stream.outbox.put(request)
        stream.watchdog.request_sent()
        return future

    # -- cache hits read from the daemon's disk tier ------------------------------------------------
    def _hit(self, job: CompileJob) -> Compiled | None:
        """The job's executable, read from the daemon's disk tier by this process; None
        (ask the daemon) on a miss, an entry in doubt, or without direct reads."""
        try:
            key = job.key
        except Exception:  # noqa: BLE001  (a malformed graph: the daemon says what is wrong)
            return None
        return self.read([key]).get(key)

    def read(self, keys: list[str], connect: bool = True) -> dict[str, Compiled]:
        """The executables of `keys` this process reads from the daemon's disk tier itself,
        all in one go (a key missing from the answer: ask the daemon). Read-only, and only
        from the disk tier of a daemon that answers (`connect`: reaching it first if need
        be), in a directory of this user's only."""
        disk = self._direct(connect) if self.direct_reads else None
        if disk is None:
            return {}
        found = disk.executables(keys)
        if found:
            self.tiers["DIRECT"] = self.tiers.get("DIRECT", 0) + len(found)
            self._touch_later()
        # (fetched: nothing was compiled for it, it waited for nothing)
        return {key: Compiled(exe, 0.0, Tier.DIRECT) for key, exe in found.items()}

    def _direct(self, connect: bool) -> DirectReads | None:
        if self._stream is not None:  # (the hot path: connected, no lock taken)
            return self._disk
        with self._lock:
            stream = self._connect() if connect else self._stream
            return self._disk if stream is not None else None

    def _use_disk(self, info: svc.GetInfoResponse) -> None:
        """Reads from the disk tier the daemon's handshake names, from now on (under the lock)."""
        directory = Path(info.disk_tier_dir) if info.disk_tier_dir else None
        if self._disk is not None and self._disk.directory == directory:
            return
        if self._disk is not None:
            self._disk.close()
            self._disk = None
        if not self.direct_reads or directory is None or not directory.is_absolute():
            return
        try:  # (this user's alone: a cache others can write to is not read)
            check_private_dir(directory)
        except (ConfigError, OSError) as e:
            log.debug("cache hits go through the daemon: %s", e)
            return
        self._disk = DirectReads(directory)

    def _touch_later(self) -> None:
        if self._touch_timer is not None:  # (the hot path: one is set already)
            return
        with self._lock:
            if self._touch_timer is not None:
                return
            timer = self._touch_timer = threading.Timer(TOUCH_AFTER_S, self._touch)
        timer.name, timer.daemon = "trnsim-touch", True
        timer.start()
        _READING.add(self)  # (what is left at exit is told then)

    def _touch(self) -> None:
        """Tells the daemon which executables this process read from its disk tier (their
        last use, for its least recently used eviction). Nothing waits on it."""
        with self._lock:
            self._touch_timer = None
            stream, disk = self._stream, self._disk
        keys = disk.touched() if disk is not None else []
        if stream is None or not keys:
            return
        stub = svc_grpc.CompileServiceStub(stream.channel)
        for start in range(0, len(keys), MAX_TOUCH_KEYS):
            request = svc.TouchRequest(cache_keys=keys[start : start + MAX_TOUCH_KEYS])
            # (an older daemon, a busy or gone one, a channel closed meanwhile: the LRU
            # order is a little off, nothing else)
            try:
                stub.Touch(request, timeout=HEALTH_DEADLINE_S)
            except (grpc.RpcError, ValueError) as e:
                log.debug("Touch: %s", e)
                return

    # -- the stream -------------------------------------------------------------------------------
    def _connect(self) -> _Stream | None:
        """The open stream; else a new one if the daemon is due to be asked and answers."""
        if self._stream is not None:
            return self._stream
        if not self._backoff.due():
            return None
        info = self._reach()
        if info is None:
            return None
        if self._backoff.failures:
            self._tell(f"the compile daemon at {self.address} answers again: compiles go to it")
        self._backoff.answered()
        self._stream = self._open()
        self._use_disk(info)
        return self._stream

    def _reach(self) -> svc.GetInfoResponse | None:
        """The handshake of a daemon this process can use; else None, and when to ask again
        is set (after the try, so its own wait is not counted in the back-off)."""
        try:
            info = self._find_daemon()
        except (launcher.DaemonStartError, launcher.DaemonNotAnswering) as e:
            self._unreachable(str(e))  # (it may start, or answer, later)
            return None
        except ConfigError as e:  # (an untrusted socket or directory): never the op's error
            self._warn(f"compiling in process: {e}")
            self._backoff.never()
            return None
        except Exception as e:  # noqa: BLE001  (a broken socket...: compiling here is always
            # possible; no op fails for the daemon)
            self._unreachable(f"the compile daemon is unavailable: {e}")
            return None
        if info is None:
            self._backoff.failed(RECONNECT_AFTER_S)
        elif not _same_version(info, self.version):
            self._warn(
                f"the compile daemon at {self.address} runs compiler {info.compiler_version}, this "
                f"process {self.version}: compiling in process (restart the daemon to share it)"
            )
            self._backoff.never()
            return None
        return info

    def _unreachable(self, why: str) -> None:
        delay = self._backoff.failed(RECONNECT_AFTER_S)
        self._warn(f"compiling in process: {why}; asking the daemon again in {delay:g} s")

    def _find_daemon(self) -> svc.GetInfoResponse | None:
        if not self.auto_start:
            return launcher.probe(
                self.address, HEALTH_DEADLINE_S, version=self.version, fmt=compiler.FORMAT_VERSION
            )
        info = launcher.ensure_daemon(self.address, info_timeout=HEALTH_DEADLINE_S)
        if info is not None and not _same_version(info, self.version):
            # The user's own auto-started daemon from an older installation: replace it
            # (its clients fall back to compiling in process meanwhile; nothing fails).
            info = launcher.replace_daemon(self.address, info)
        return info

    def _open(self) -> _Stream:
        """A Compile stream, its reader thread and its watchdog."""
        # Executables of large graphs run to many MB: take what the daemon may send.
        channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        )
        stream = _Stream(channel, queue.Queue())
        stream.watchdog = Watchdog(
            HEALTH_DEADLINE_S,
            check=lambda: launcher.answers_health_check(channel, HEALTH_DEADLINE_S),
            waiting=lambda: bool(stream.pending) or stream.asking > 0,
            hung=lambda why: self._hung(stream, why),
            stopped=lambda: launcher.stopped(self.address),
        )
        responses = svc_grpc.CompileServiceStub(channel).Compile(self._requests(stream.outbox))
        threading.Thread(
            target=self._read, args=(stream, responses), name="trnsim-compile-stream", daemon=True
        ).start()
        return stream

    @staticmethod
    def _requests(outbox: queue.Queue[svc.CompileRequest | None]):  # type: ignore[no-untyped-def]
        while True:
            request = outbox.get()
            if request is None:
                return
            yield request

    def _read(self, stream: _Stream, responses: grpc.Future) -> None:
        try:
            for result in responses:
                stream.watchdog.heard()
                with self._lock:
                    future = stream.pending.pop(result.id, None)
                if future is not None:
                    future.set_result(result)
        except grpc.RpcError as e:
            log.debug("compile stream ended: %s", e)
        self._lost(stream, "the compile daemon went away")

    def _hung(self, stream: _Stream, why: str) -> None:
        """The watchdog heard nothing from the daemon: what waits on it is compiled here."""
        self._tell(f"{why}: compiling in process")
        self._lost(stream, why)

    def _lost(self, stream: _Stream, why: str, retry_later: bool = True) -> None:
        """Gives up a stream (once): its waiting requests fail with DaemonUnavailable (and
        are compiled here); the daemon is asked again after the back-off."""
        with self._lock:
            if self._stream is not stream:
                return
            self._stream = None
            pending, stream.pending = stream.pending, {}
            if retry_later:
                self._backoff.failed(RECONNECT_AFTER_S)
        stream.outbox.put(None)
        stream.watchdog.stop()
        for future in pending.values():
            future.set_exception(DaemonUnavailable(why))
        stream.channel.close()

    @contextlib.contextmanager
    def _asking(self, stream: _Stream) -> Iterator[grpc.Channel]:
        """A unary call on the stream's channel: the watchdog counts it as waiting."""
        with self._lock:
            stream.asking += 1
        stream.watchdog.request_sent()
        try:
            yield stream.channel
        finally:
            with self._lock:
                stream.asking -= 1

    # -- helpers ------------------------------------------------------------------------------------
    def executable(self, result: svc.CompileResult, key: str) -> executable_pb2.Executable | None:
        """The executable a result carries, if it is intact and is the one for `key` (the
        key this process computed for its graph): else None."""
        if result.WhichOneof("outcome") != "executable":
            return None
        return executable_of(result.executable, key, self.version, compiler.FORMAT_VERSION)

    def _compile_here(self, job: CompileJob, why: str) -> Compiled:
        self.fallbacks += 1
        self._warn(f"compiling in process: {why}")
        return self.local.compile(job)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"trnsim: {message}", RuntimeWarning, stacklevel=4)
        log.debug("%s", message)

    def _tell(self, message: str) -> None:
        """A change in the daemon's state: the process's first daemon warning, or logged."""
        if self._warned:
            log.info("%s", message)
        else:
            self._warn(message)

    def close(self) -> None:
        timer = self._touch_timer
        if timer is not None:
            timer.cancel()
        self._touch()  # (what was read since the last Touch)
        stream = self._stream
        if stream is not None:
            self._lost(stream, "closed", retry_later=False)
        with self._lock:
            disk, self._disk = self._disk, None
        if disk is not None:
            disk.close()
        self.local.close()

    def cached(self, key: str) -> Compiled | None:
        hit = self.read([key], connect=False).get(key)
        if hit is not None:
            return hit
        stream = self._stream
        if stream is None:
            return None
        request = svc.LookupRequest(
            cache_keys=[key], compiler_version=self.version, format_version=compiler.FORMAT_VERSION
        )
        try:
            with self._asking(stream) as channel:
                (entry,) = (
                    svc_grpc.CompileServiceStub(channel)
                    .Lookup(request, timeout=LOOKUP_DEADLINE_S)
                    .entries
                )
        except (grpc.RpcError, ValueError) as e:  # (a slow, hung or dead daemon: compile as usual)
            log.debug("Lookup: %s", e)
            return None
        if not entry.found:
            return None
        exe = self.executable(svc.CompileResult(executable=entry.executable), key)
        if exe is None:
            return None
        return Compiled(exe, 0.0, self._tier(entry.tier))  # (fetched: nothing compiled for it)

    def nearest(self, missed: list[Parts]) -> list[Parts | None] | None:
        stream = self._stream
        if stream is None or not missed:
            return None
        request = svc.NearestRequest()
        for key, parts in missed[:256]:
            item = request.missed.add(cache_key=key)
            for p in parts:
                item.parts.add(name=p.name, digest=p.digest, text=p.text)
        try:
            with self._asking(stream) as channel:
                answers = (
                    svc_grpc.CompileServiceStub(channel)
                    .Nearest(request, timeout=NEAREST_DEADLINE_S)
                    .answers
                )
        except grpc.RpcError as e:  # (an older daemon, a dead one: explain() compares locally)
            log.debug("Nearest: %s", e)
            return None
        return [
            (a.nearest_key, [compiler.KeyPart(p.name, p.digest, p.text) for p in a.nearest_parts])
            if a.nearest_key
            else None
            for a in answers
        ]


# Clients that read hits from a disk tier: at exit, each tells its daemon what it read since
# its last Touch (a training process exits without closing its client).
_READING: weakref.WeakSet[DaemonCompileClient] = weakref.WeakSet()


@atexit.register
def _touch_at_exit() -> None:
    for client in list(_READING):
        client._touch()


@dataclass(eq=False)
class _Stream:
    """One Compile stream to the daemon: its channel, the requests to send, the answers owed
    on it, and the watchdog that tells a busy daemon from a hung one."""

    channel: grpc.Channel
    outbox: queue.Queue[svc.CompileRequest | None]
    pending: dict[int, Future[svc.CompileResult]] = field(default_factory=dict)
    asking: int = 0  # unary calls (Lookup, Nearest) waiting on the channel
    watchdog: Watchdog = field(init=False)


def _same_version(info: svc.GetInfoResponse, version: str) -> bool:
    return info.compiler_version == version and info.format_version == compiler.FORMAT_VERSION


def compile_request(job: CompileJob, background: bool = False) -> svc.CompileRequest:
    request = svc.CompileRequest(
        priority=svc.BACKGROUND if background else svc.BLOCKING,
        graph=job.graph,
        target=job.target,
        options=job.options,
        compiler_version=compiler.compiler_version(),
        format_version=compiler.FORMAT_VERSION,
    )
    if job.debug is not None:
        request.debug.CopyFrom(job.debug)
    return request


def _pass_on(source: Future[Compiled], target: Future[Compiled]) -> None:
    try:
        target.set_result(source.result())
    except Exception as e:  # noqa: BLE001  (the compile's error, whatever it is)
        target.set_exception(e)


def make_client() -> CompileClient:
    """NEURON_COMPILE_DAEMON: unset/auto = the host's daemon (started if none answers),
    off = in process, anything else = that daemon's address."""
    setting = env.compile_daemon()
    if setting == "off":
        return InProcessCompileClient()
    if setting == "auto":
        return DaemonCompileClient(default_address(env.sim_node()), auto_start=True)
    address = setting if setting.startswith("unix:") or ":" in setting else f"unix:{setting}"
    return DaemonCompileClient(address, auto_start=False)
