"""The CompileService: one method per RPC (protos/compile_service.proto)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import grpc
from trnsim import compiler
from trnsim.compiler.graph import GraphError, from_proto
from trnsim.daemon import wire
from trnsim.daemon.cache import ExecutableCache
from trnsim.daemon.config import ConfigError, DaemonConfig
from trnsim.daemon.inflight import Deliver, InFlight, Job, Submitted, Waiter
from trnsim.daemon.remote import RemoteTier, open_store, read_cluster_key
from trnsim.daemon.wire import Undecodable
from trnsim.daemon.workers import STOPPING, Done, WorkerPool, reap_orphans
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import compile_service_pb2_grpc as svc_grpc
from trnsim.protos.blobs import blob_ok
from trnsim.simulator.config import TARGETS, get_target

log = logging.getLogger(__name__)
MAX_LOOKUP_KEYS = 10_000
MAX_NEAREST_KEYS = 256
NEAREST_SCAN = 5_000  # the newest keys compiled before a miss that Nearest compares it with
FAST_PATH_MAX_NODES = 2_000  # larger graphs are hashed on the I/O threads
_HEX = frozenset("0123456789abcdef")


class Histogram:
    """Durations in log-spaced buckets (each 5% wider than the last): the count and sum are
    exact, a percentile is within 2.5% of the true one, and the memory is a fixed number of
    buckets however many values come (a list of every compile's time grew for ever)."""

    LOW = 1e-4  # seconds: the first bucket holds everything below
    RATIO = 1.05
    BUCKETS = 450  # up to LOW * RATIO**BUCKETS, about 3.5e5 s; longer ones share the last

    def __init__(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = 0.0

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.counts[self._bucket(seconds)] += 1
        self.count += 1
        self.total += seconds
        self.low = min(self.low, seconds)
        self.high = max(self.high, seconds)

    def _bucket(self, seconds: float) -> int:
        if seconds <= self.LOW:
            return 0
        index = 1 + int(math.log(seconds / self.LOW, self.RATIO))
        return min(index, self.BUCKETS - 1)

    def percentile(self, q: float) -> float:
        """The value below which a fraction q of the durations fall (0 when there are none):
        the middle of its bucket, kept within the smallest and largest seen."""
        if not self.count:
            return 0.0
        rank = min(self.count - 1, int(q * self.count))
        seen = 0
        for index, n in enumerate(self.counts):
            seen += n
            if seen > rank:
                middle = self.LOW * self.RATIO ** (index - 0.5) if index else self.LOW
                return min(self.high, max(self.low, middle))
        return self.high


class Stats:
    """Counters behind the Stats RPC; each takes constant memory, however long the daemon
    runs (failures are counted per error class, compile times in a histogram)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.lookups = 0
        self.direct_hits = 0  # executables clients read from the disk tier themselves (Touch)
        self.compiles = 0
        self.failures: dict[str, int] = {}
        self.compile_seconds = Histogram()
        self.seconds_saved = 0.0

    def failure(self, error_class: svc.ErrorClass) -> None:
        name = svc.ErrorClass.Name(error_class)
        with self.lock:
            self.failures[name] = self.failures.get(name, 0) + 1


class Pool(Protocol):
    """What the service needs of its compile pool: workers that take jobs from the in-flight
    table and hand each result to the service (workers.WorkerPool: one process each)."""

    size: int
    restarts: int

    def alive(self) -> int: ...

    def stop(self, wait_s: float = 5.0) -> None: ...


# Starts a pool on the service's in-flight table, reporting each result to `done`.
StartPool = Callable[[InFlight, Done], Pool]


class CompileService(svc_grpc.CompileServiceServicer):
    """The RPCs over injected parts: the executable cache, the in-flight table, and a pool
    started on that table (build_service() makes the daemon's own; tests pass fakes)."""

    def __init__(
        self,
        config: DaemonConfig,
        cache: ExecutableCache,
        inflight: InFlight,
        start_pool: StartPool,
    ) -> None:
        self.config = config
        self.version = compiler.compiler_version()
        self.cache = cache
        self.inflight = inflight
        self.stats = Stats()
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.draining = False
        self._streams = 0
        self._ending = False  # end_streams() was called: every stream ends once answered
        self._enders: dict[int, Callable[[], None]] = {}  # open stream -> end it (loop only)
        self._stream_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="daemon-io")
        self.pool = start_pool(inflight, self._compiled)

    # -- Compile: a bidirectional stream per client process -------------------------------------
    async def Compile(
        self,
        request_iterator: AsyncIterator[svc.CompileRequest | Undecodable],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[svc.CompileResult]:
        """Cache hits are answered on the event loop; everything else (disk, validation,
        queueing) runs on the I/O threads; compiled results come back from the workers."""
        with self._lock:
            if self._streams >= self.config.max_streams:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the daemon serves at most {self.config.max_streams} streams",
                )
            self._streams += 1
            stream = next(self._stream_ids)
        self.inflight.open_stream(stream)
        loop = asyncio.get_running_loop()
        # (answer, whether it settles an owed request) | "closed" | "gone"
        out: asyncio.Queue[tuple[svc.CompileResult, bool] | str] = asyncio.Queue()
        owed: Counter[int] = Counter()  # answers still owed, by request id (loop only)
        self._enders[stream] = lambda: out.put_nowait("closed")
        if self._ending:
            out.put_nowait("closed")

        def from_thread(result: svc.CompileResult) -> None:
            loop.call_soon_threadsafe(out.put_nowait, (result, True))

        async def read() -> None:
            ending = "gone"
            try:
                async for request in request_iterator:
                    self.last_activity = time.monotonic()
                    self._take(stream, request, owed, out, from_thread)
                ending = "closed"  # the client half-closed: the answers still go out
            except (grpc.RpcError, asyncio.CancelledError):
                pass  # the client went away
            except Exception:
                log.exception("compile stream %d failed", stream)
            finally:
                out.put_nowait(ending)

        reader = asyncio.ensure_future(read())
        closed = False
        try:
            while not (closed and not +owed):
                item = await out.get()
                if item == "gone":
                    return
                if item == "closed":
                    closed = True
                    continue
                assert isinstance(item, tuple)
                result, settles = item
                if settles and owed[result.id] > 0:
                    owed[result.id] -= 1
                yield result
        finally:
            reader.cancel()
            self._enders.pop(stream, None)
            self.inflight.close_stream(stream)
            with self._lock:
                self._streams -= 1
            self.last_activity = time.monotonic()

    def _take(
        self,
        stream: int,
        request: svc.CompileRequest | Undecodable,
        owed: Counter[int],
        out: asyncio.Queue[tuple[svc.CompileResult, bool] | str],
        from_thread: Deliver,
    ) -> None:
        """One message of a Compile stream: answered at once, or sent the slow way."""
        if isinstance(request, Undecodable):
            self.stats.failure(svc.INVALID_REQUEST)
            message = f"not a CompileRequest message: {request.error}"
            answer = _error_result(request.request_id, svc.INVALID_REQUEST, message)
            out.put_nowait((answer, False))
            return
        if request.cancel:
            owed.pop(request.id, None)  # (withdrawn: no answer is owed, whatever still comes)
        else:
            owed[request.id] += 1
        fast = self._answer_fast(stream, request, lambda r: out.put_nowait((r, True)))
        if fast is not True:
            self.inflight.expect(stream, request.id)
            asyncio.get_running_loop().run_in_executor(
                self._io, self._handle_safely, stream, request, from_thread, fast or None
            )

    def _answer_fast(
        self, stream: int, request: svc.CompileRequest, deliver: Deliver
    ) -> bool | str:
        """Answers from the memory tier when it can (True). Otherwise the request goes the
        slow way, with its key when it was hashed here (a miss), else False. Only small
        graphs are hashed here: the event loop serves every client."""
        with self.stats.lock:
            self.stats.requests += 1
        if request.cancel:
            self.inflight.withdraw(stream, request.id)
            return True
        if len(request.graph.nodes) > FAST_PATH_MAX_NODES or self._check(request) is not None:
            return False
        try:
            key = compiler.cache_key_from_proto(
                request.graph, get_target(request.target), request.options
            ).digest
        except Exception:  # noqa: BLE001  (malformed: the slow path answers with the reason)
            return False
        blob = self.cache.memory_get(key)
        if blob is None:
            return key
        with self.stats.lock:
            self.stats.seconds_saved += blob.compile_seconds
        deliver(svc.CompileResult(id=request.id, cache_key=key, executable=blob, tier=svc.MEMORY))
        return True

    def _handle_safely(
        self, stream: int, request: svc.CompileRequest, deliver: Deliver, key: str | None = None
    ) -> None:
        """_handle, with the guarantee that the request gets an answer, whatever fails."""
        answered = False

        def once(result: svc.CompileResult) -> None:
            nonlocal answered
            answered = True
            deliver(result)

        try:
            self._handle(stream, request, once, key)
        except Exception as e:
            log.exception("handling request %d of stream %d failed", request.id, stream)
            if not answered:
                message = f"internal error of the compile daemon ({type(e).__name__}: {e})"
                self.stats.failure(svc.TRANSIENT)
                once(_error_result(request.id, svc.TRANSIENT, message))

    def _handle(
        self, stream: int, request: svc.CompileRequest, deliver: Deliver, key: str | None = None
    ) -> None:
        """A request the memory tier did not answer; `key`, when the event loop already
        hashed its graph after checking its versions (the graph is validated here all the
        same)."""
        error = self._check(request) if key is None else None
        if error is not None:
            self.stats.failure(error.error_class)
            deliver(svc.CompileResult(id=request.id, error=error))
            return
        try:
            from_proto(request.graph)  # validated (types, names, limits) before anything else
            refused = wire.request_problem(request)
            if refused is not None:  # (never compiled, never cached)
                self.stats.failure(refused.error_class)
                deliver(svc.CompileResult(id=request.id, error=refused))
                return
            if key is None:
                key = compiler.cache_key_from_proto(
                    request.graph, get_target(request.target), request.options
                ).digest
        except GraphError as e:
            self._invalid(request, deliver, e)
            return
        self._lookup_or_queue(stream, request, deliver, key)

    def _lookup_or_queue(
        self,
        stream: int,
        request: svc.CompileRequest,
        deliver: Deliver,
        key: str,
        again: bool = True,
    ) -> None:
        """Answers a valid request from the cache, or queues (or joins) its compile. The
        ticket is taken before the lookup: if a compile of the key ended between the lookup
        and the queueing, its result is cached, and the request looks `again` (once) rather
        than starting a second compile of the same key (inflight.py)."""
        ticket = self.inflight.ticket() if again else None
        hit = self.cache.get(key)
        if hit is not None:
            blob, tier = hit
            with self.stats.lock:
                self.stats.seconds_saved += blob.compile_seconds
            deliver(svc.CompileResult(id=request.id, cache_key=key, executable=blob, tier=tier))
            return
        cached_error = self.cache.get_error(key)
        if cached_error is not None:
            deliver(svc.CompileResult(id=request.id, cache_key=key, error=cached_error))
            return
        if self.draining:
            deliver(
                svc.CompileResult(
                    id=request.id,
                    error=svc.CompileError(error_class=svc.CANCELLED, message=STOPPING),
                )
            )
            return
        priority = request.priority or svc.BLOCKING
        waiter = Waiter(stream, request.id, priority, deliver)
        job_key, job_request = shared_job(key, request)
        if self.inflight.submit(job_key, job_request, waiter, ticket) is Submitted.FINISHED:
            self._lookup_or_queue(stream, request, deliver, key, again=False)

    def _invalid(self, request: svc.CompileRequest, deliver: Deliver, e: Exception) -> None:
        self.stats.failure(svc.INVALID_REQUEST)
        error = svc.CompileError(error_class=svc.INVALID_REQUEST, message=f"malformed graph: {e}")
        deliver(svc.CompileResult(id=request.id, error=error))

    def _check(self, request: svc.CompileRequest) -> svc.CompileError | None:
        if (
            request.compiler_version != self.version
            or request.format_version != compiler.FORMAT_VERSION
        ):
            return svc.CompileError(
                error_class=svc.VERSION_MISMATCH,
                message=(
                    f"client compiler {request.compiler_version or '?'} (format {request.format_version}) "
                    f"differs from the daemon's {self.version} (format {compiler.FORMAT_VERSION}); "
                    f"compile in process or restart the daemon from the same installation"
                ),
            )
        if request.target not in TARGETS:
            return svc.CompileError(
                error_class=svc.INVALID_REQUEST, message=f"unknown target {request.target!r}"
            )
        if len(request.graph.nodes) > self.config.max_nodes:
            return svc.CompileError(
                error_class=svc.INVALID_REQUEST,
                message=f"{len(request.graph.nodes)} nodes, over the daemon's limit of {self.config.max_nodes}",
            )
        return None

    def _compiled(self, job: Job, result: svc.CompileResult) -> None:
        """A worker finished a job: cache it (or its deterministic error), answer the waiters
        (always, even when caching fails)."""
        try:
            self._record(job, result)
        except Exception:
            log.exception("recording the compile of %s failed; answering anyway", job.key[:16])
        waiters = self.inflight.finish(job, result)
        if result.WhichOneof("outcome") == "executable":
            try:  # (after the answer: nobody waits for what only explanations need)
                self._put_parts(job)
            except Exception:
                log.exception("keeping the key parts of %s failed", job.key[:16])
        if result.WhichOneof("outcome") == "executable" and waiters > 1:
            with self.stats.lock:
                self.stats.seconds_saved += (waiters - 1) * result.compile_seconds

    def _record(self, job: Job, result: svc.CompileResult) -> None:
        outcome = result.WhichOneof("outcome")
        with self.stats.lock:
            self.stats.compiles += 1
            if outcome == "executable":
                self.stats.compile_seconds.add(result.compile_seconds)
        if outcome == "executable" and not blob_ok(result.executable, job.cache_key):
            outcome = "error"  # damaged on its way from the worker: never cached
            result.error.CopyFrom(
                svc.CompileError(
                    error_class=svc.TRANSIENT,
                    message="the worker's executable failed its digest check",
                )
            )
        if outcome == "executable":
            result.cache_key = job.cache_key
            result.tier = svc.COMPILED
            self.cache.put(job.cache_key, result.executable)
        else:
            self.stats.failure(result.error.error_class)
            deterministic = result.error.error_class in (
                svc.DETERMINISTIC,
                svc.OUT_OF_DEVICE_MEMORY,
            )
            if deterministic:
                self.cache.put_error(job.cache_key, result.error, self.config.error_ttl_s)

    def _put_parts(self, job: Job) -> None:
        """The compiled key's parts, for `Nearest` to compare later misses with."""
        request = job.request
        try:
            parts = compiler.key_parts(request.graph, get_target(request.target), request.options)
        except (GraphError, KeyError, ValueError) as e:
            log.debug("no key parts for %s: %s", job.cache_key[:16], e)
            return
        message = svc.KeyParts(cache_key=job.cache_key)
        for p in parts:
            message.parts.add(name=p.name, digest=p.digest, text=p.text)
        self.cache.put_parts(message)

    # -- unary RPCs -------------------------------------------------------------------------------
    async def Nearest(
        self, request: svc.NearestRequest, context: grpc.aio.ServicerContext
    ) -> svc.NearestResponse:
        """For each missed key, the key compiled before it that shares the most parts."""
        if len(request.missed) > MAX_NEAREST_KEYS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {MAX_NEAREST_KEYS} keys per Nearest"
            )
        return await asyncio.get_running_loop().run_in_executor(self._io, self._nearest, request)

    def _nearest(self, request: svc.NearestRequest) -> svc.NearestResponse:
        response = svc.NearestResponse()
        known = self.cache.all_parts(NEAREST_SCAN)  # (stored at, parts), newest first
        stored = {parts.cache_key: at for at, parts in known}
        for missed in request.missed:
            answer = response.answers.add(cache_key=missed.cache_key)
            before = stored.get(missed.cache_key, float("inf"))
            candidates = [
                (c.cache_key, [compiler.KeyPart(p.name, p.digest, p.text) for p in c.parts])
                for at, c in known
                if at < before and c.cache_key != missed.cache_key
            ]
            mine = [compiler.KeyPart(p.name, p.digest, p.text) for p in missed.parts]
            best = compiler.nearest(mine, candidates)
            if best is not None:
                answer.nearest_key = best[0]
                for p in best[1]:
                    answer.nearest_parts.add(name=p.name, digest=p.digest, text=p.text)
        return response

    async def Lookup(
        self, request: svc.LookupRequest, context: grpc.aio.ServicerContext
    ) -> svc.LookupResponse:
        """Memory hits answered on the event loop; the disk tier on the I/O threads."""
        if (
            request.compiler_version != self.version
            or request.format_version != compiler.FORMAT_VERSION
        ):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"client compiler {request.compiler_version} differs from the daemon's {self.version}",
            )
        if len(request.cache_keys) > MAX_LOOKUP_KEYS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {MAX_LOOKUP_KEYS} keys per Lookup"
            )
        bad = [k for k in request.cache_keys if len(k) != 64 or not _HEX.issuperset(k)]
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{bad[0][:80]!r} is not a cache key (64 hex digits)",
            )
        self.last_activity = time.monotonic()
        if all(self.cache.memory_has(k) for k in request.cache_keys):
            return self._lookup(request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, self._lookup, request)

    def _lookup(self, request: svc.LookupRequest) -> svc.LookupResponse:
        response = svc.LookupResponse()
        for key in request.cache_keys:
            if request.presence_only:
                found = self.cache.has(key)
                response.entries.add(cache_key=key, found=found)
                if found and self.cache.remote is not None:  # (trnsim precompile: warm the cluster)
                    hit = self.cache.get(key)
                    if hit is not None:
                        self.cache.remote.put_later(key, hit[0], only_if_absent=True)
                continue
            hit = self.cache.get(key)
            entry = response.entries.add(cache_key=key, found=hit is not None)
            if hit is not None:
                entry.executable.CopyFrom(hit[0])
                entry.tier = hit[1]
        with self.stats.lock:
            self.stats.lookups += len(request.cache_keys)
        return response

    async def Touch(
        self, request: svc.TouchRequest, context: grpc.aio.ServicerContext
    ) -> svc.TouchResponse:
        """Marks executables clients read from the disk tier themselves as just used."""
        if len(request.cache_keys) > MAX_LOOKUP_KEYS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {MAX_LOOKUP_KEYS} keys per Touch"
            )
        keys = [k for k in request.cache_keys if len(k) == 64 and _HEX.issuperset(k)]
        self.last_activity = time.monotonic()
        loop = asyncio.get_running_loop()
        touched = await loop.run_in_executor(self._io, self.cache.touch, keys)
        with self.stats.lock:
            self.stats.direct_hits += touched
        return svc.TouchResponse(touched=touched)

    async def GetInfo(
        self, request: svc.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> svc.GetInfoResponse:
        compatible = (
            request.client_compiler_version == self.version
            and request.client_format_version == compiler.FORMAT_VERSION
        )
        return svc.GetInfoResponse(
            compiler_version=self.version,
            format_version=compiler.FORMAT_VERSION,
            targets=sorted(TARGETS),
            pid=os.getpid(),
            address=self.config.address,
            started_at=self.started,
            compatible=compatible,
            cache_dir=str(self.config.cache_dir),
            disk_tier_dir=str(self.cache.directory.absolute()),
        )

    async def Stats(
        self, request: svc.StatsRequest, context: grpc.aio.ServicerContext
    ) -> svc.StatsResponse:
        return await asyncio.get_running_loop().run_in_executor(self._io, self.snapshot)

    def snapshot(self) -> svc.StatsResponse:
        queued, running, waiters = self.inflight.counts()
        entries, volume = self.cache.disk_stats()
        with self.stats.lock:
            seconds = self.stats.compile_seconds
            response = svc.StatsResponse(
                requests=self.stats.requests,
                lookups=self.stats.lookups,
                direct_hits=self.stats.direct_hits,
                memory=self.cache.memory.counters.to_proto(
                    len(self.cache.memory), self.cache.memory.nbytes
                ),
                disk=self.cache.disk_counters.to_proto(entries, volume),
                compiles=self.stats.compiles,
                joins=self.inflight.joins,
                failures=self.stats.failures,
                corrupt_entries=self.cache.corrupt,
                queue_depth=queued,
                in_flight=running,
                waiters=waiters,
                workers=self.pool.size,
                compile_seconds_total=seconds.total,
                compile_seconds_p50=seconds.percentile(0.5),
                compile_seconds_p99=seconds.percentile(0.99),
                seconds_saved=self.stats.seconds_saved,
                connected_clients=self._streams,
                uptime_seconds=time.time() - self.started,
                worker_restarts=self.pool.restarts,
                dropped_jobs=self.inflight.dropped,
                disk_errors=self.cache.disk_errors,
                workers_alive=self.pool.alive(),
                disk_tier_off=self.cache.disk_off,
            )
        if self.cache.remote is not None:
            response.remote.CopyFrom(self.cache.remote.to_proto())
        return response

    # -- lifecycle ------------------------------------------------------------------------------
    def idle(self) -> bool:
        queued, running, _ = self.inflight.counts()
        return self._streams == 0 and queued == 0 and running == 0

    def drain(self, timeout_s: float) -> None:
        """No new compiles; running ones finish (up to timeout_s); queued ones go back. Then
        every request still waiting is answered CANCELLED (its client compiles it in process)
        and the workers are stopped, mid-compile or not. Call end_streams() after, on the
        event loop, for the answers to reach their clients before the server stops."""
        self.draining = True
        self.inflight.cancel_queued(STOPPING)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, running, _ = self.inflight.counts()
            if running == 0:
                break
            time.sleep(0.05)
        cancelled = self.inflight.cancel_all(STOPPING)
        if cancelled:
            log.warning(
                "%d requests still waited after the %.0f s drain: answered CANCELLED "
                "(their clients compile in process)",
                cancelled,
                timeout_s,
            )
        self.pool.stop()

    def end_streams(self) -> None:
        """Ends every Compile stream, now and later, once its owed answers are sent: its
        client sees the stream end (and compiles in process), not the server's cancel.
        On the event loop, after drain()."""
        self._ending = True
        for end in list(self._enders.values()):
            end()

    def close(self) -> None:
        self.pool.stop()
        self._io.shutdown(wait=True)
        self.cache.close()


def build_service(config: DaemonConfig) -> CompileService:
    """The daemon's own parts: the cache in config.cache_dir, worker processes."""
    version = compiler.compiler_version()
    remote = remote_tier(config, version) if config.remote else None  # (refused: no start)
    orphans = reap_orphans()
    if orphans:
        log.warning(
            "killed %d compile workers left by a daemon that died: pids %s",
            len(orphans),
            ", ".join(map(str, orphans)),
        )
    cache = ExecutableCache(
        config.cache_dir / "executables",
        config.memory_cache_bytes,
        config.disk_cache_bytes,
        tag=version,
    )
    cache.remote = remote

    def start_pool(inflight: InFlight, done: Done) -> Pool:
        return WorkerPool(config.workers, inflight, done, config.compile_timeout_s)

    return CompileService(config, cache, InFlight(), start_pool)


def remote_tier(config: DaemonConfig, version: str) -> RemoteTier:
    """The cluster tier config names; ConfigError (the daemon does not start) for a store
    URL it cannot use or a missing or open cluster key. A store that does not answer is no
    error: its first call fails within the deadline, and the tier is off until it answers."""
    if config.remote_key_file is None:
        raise ConfigError(
            f"the remote cache {config.remote} needs a cluster key to sign its entries: the same "
            f"file on every host, readable by the daemon's user only (`umask 077; head -c 32 "
            f"/dev/urandom > FILE`), named by NEURON_CACHE_REMOTE_KEY_FILE or --remote-key-file"
        )
    secret = read_cluster_key(config.remote_key_file)
    store = open_store(config.remote, config.remote_deadline_s)
    log.info("remote cache tier: %s (deadline %.2f s)", store.name, config.remote_deadline_s)
    return RemoteTier(store, secret, version, config.remote_max_entry_bytes, latency=Histogram())


def _error_result(request_id: int, error_class: svc.ErrorClass, message: str) -> svc.CompileResult:
    error = svc.CompileError(error_class=error_class, message=message)
    return svc.CompileResult(id=request_id, error=error)


# Options that change how a compile runs, never what it makes (compiler/keys.py leaves them
# out of the key): test hooks that crash or slow a worker, and source-line debug info.
_HOOKS = ("debug_crash_worker", "debug_sleep_ms")


def shared_job(key: str, request: svc.CompileRequest) -> tuple[str, svc.CompileRequest]:
    """The job a request joins: the compile of its key with nothing of the requester's own
    (no debug info: clients attach their own source lines; the executable is the same for
    everyone). A request with a test hook set gets a job of its own that nobody else joins."""
    job = svc.CompileRequest()
    job.CopyFrom(request)
    job.id = 0
    job.ClearField("debug")
    job.options.emit_debug_info = False
    hooks = [
        f"{name}={getattr(request.options, name)}"
        for name in _HOOKS
        if getattr(request.options, name)
    ]
    return (f"{key}:{','.join(hooks)}" if hooks else key), job
