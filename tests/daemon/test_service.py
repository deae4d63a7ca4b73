"""The compile service in this process, on a real gRPC server over a temporary Unix socket,
composed with a fake pool: a thread that holds each job until the test lets it go, then
compiles it in process (worker.compile_request, the workers' own function) or answers what
the test scripts. What only a fake can arrange is tested here deterministically: requests
joining a job held open, a worker handing back a damaged executable, a cached error answered
without a compile. The real worker processes are tested in test_reliability.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trnsim.daemon.cache import ExecutableCache
from trnsim.daemon.config import DaemonConfig
from trnsim.daemon.inflight import InFlight, Job
from trnsim.daemon.server import create_server
from trnsim.daemon.service import CompileService
from trnsim.daemon.worker import compile_request
from trnsim.daemon.workers import Done
from trnsim.protos import compile_service_pb2 as svc

from .helpers import daemon_stats, request

pytestmark = pytest.mark.timeout(120)
Answer = Callable[[svc.CompileRequest], svc.CompileResult]


class HeldPool:
    """One thread that takes each job, waits for `release`, and answers it with `answer`."""

    size = 1
    restarts = 0

    def __init__(self, inflight: InFlight, done: Done, answer: Answer) -> None:
        self.inflight, self.done, self.answer = inflight, done, answer
        self.release = threading.Event()
        self.taken: list[Job] = []
        self.took = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            job = self.inflight.next_job(timeout=0.1)
            if job is None:
                continue
            self.taken.append(job)
            self.took.set()
            while not self.release.wait(0.1):
                if self._stopping:
                    return
            self.done(job, self.answer(job.request))

    def alive(self) -> int:
        return int(self._thread.is_alive())

    def stop(self, wait_s: float = 5.0) -> None:
        self._stopping = True
        self.inflight.close()
        self._thread.join(wait_s)


class InProcessDaemon:
    """A CompileService over the given answer function, served on its own event loop."""

    def __init__(self, directory: Path, answer: Answer = compile_request) -> None:
        directory.mkdir(mode=0o700)
        self.address = f"unix:{directory}/d.sock"
        self.config = DaemonConfig(address=self.address, cache_dir=directory / "cache", workers=1)
        self.cache = ExecutableCache(directory / "cache" / "executables", 1 << 24, 1 << 26)
        self.pools: list[HeldPool] = []

        def start_pool(inflight: InFlight, done: Done) -> HeldPool:
            self.pools.append(HeldPool(inflight, done, answer))
            return self.pools[-1]

        self.service = CompileService(self.config, self.cache, InFlight(), start_pool)
        self._ready = threading.Event()
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        assert self._ready.wait(30) and not self._failed, self._failed

    async def _serve(self) -> None:
        try:
            bound = create_server(self.address, self.config, self.service)
            await bound.server.start()
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        except BaseException as e:
            self._failed.append(e)
            raise
        finally:
            self._ready.set()
        await self._stop.wait()
        await bound.server.stop(grace=1)

    @property
    def pool(self) -> HeldPool:
        return self.pools[0]

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.service.close()


@pytest.fixture
def served(short_tmp):  # type: ignore[no-untyped-def]
    made: list[InProcessDaemon] = []

    def serve(answer: Answer = compile_request) -> InProcessDaemon:
        made.append(InProcessDaemon(short_tmp / f"d{len(made)}", answer))
        return made[-1]

    yield serve
    for d in made:
        d.close()


def _submit(address: str, *requests: svc.CompileRequest):  # type: ignore[no-untyped-def]
    from trnsim.client.core.compile_client import DaemonCompileClient

    client = DaemonCompileClient(address, auto_start=False)
    return client, [client.submit(r) for r in requests]


def test_requests_for_one_graph_from_two_clients_join_one_compile(served):
    d = served()
    first, (a,) = _submit(d.address, request(1))
    assert d.pool.took.wait(30), "the job reached the pool"
    second, (b,) = _submit(d.address, request(1))  # the same graph, while it compiles
    try:
        stats = daemon_stats(d.address)
        while stats.joins < 1:  # (the second request is still on its way through the I/O pool)
            time.sleep(0.01)
            stats = daemon_stats(d.address)
        d.pool.release.set()
        results = [a.result(timeout=60), b.result(timeout=60)]
    finally:
        first.close()
        second.close()
    assert [r.WhichOneof("outcome") for r in results] == ["executable", "executable"]
    assert results[0].cache_key == results[1].cache_key
    assert len(d.pool.taken) == 1 and daemon_stats(d.address).compiles == 1


def test_a_hit_in_memory_is_answered_without_the_pool(served):
    d = served()
    d.pool.release.set()
    client, (a,) = _submit(d.address, request(2))
    assert a.result(timeout=60).tier == svc.COMPILED
    _, (b,) = _submit(d.address, request(2))
    assert b.result(timeout=60).tier == svc.MEMORY and len(d.pool.taken) == 1
    client.close()


def test_an_executable_damaged_on_its_way_from_the_worker_is_never_cached(served):
    def damaged(req: svc.CompileRequest) -> svc.CompileResult:
        result = compile_request(req)
        result.executable.data = result.executable.data[:-1] + b"\0"
        return result

    d = served(damaged)
    d.pool.release.set()
    client, (a,) = _submit(d.address, request(3))
    result = a.result(timeout=60)
    client.close()
    assert result.WhichOneof("outcome") == "error" and result.error.error_class == svc.TRANSIENT
    assert "digest" in result.error.message
    assert d.cache.keys() == [] and len(d.cache.memory) == 0, "nothing kept"


def test_a_deterministic_error_is_remembered_and_answered_without_a_compile(served):
    def refuses(req: svc.CompileRequest) -> svc.CompileResult:
        error = svc.CompileError(error_class=svc.DETERMINISTIC, message="no kernel for this op")
        return svc.CompileResult(id=req.id, error=error)

    d = served(refuses)
    d.pool.release.set()
    client, (a, b) = _submit(d.address, request(4), request(5))
    assert a.result(timeout=60).error.message == "no kernel for this op"
    assert b.result(timeout=60).error.error_class == svc.DETERMINISTIC
    _, (again,) = _submit(d.address, request(4))
    assert again.result(timeout=60).error.message == "no kernel for this op"
    assert len(d.pool.taken) == 2, "the second ask for graph 4 reached no worker"
    client.close()


def test_each_request_is_told_the_compile_time_it_waited_for(served):
    """All of it for the request that started the compile, the rest of it for one joining
    while it runs, none for a hit."""
    d = served()
    first, (a,) = _submit(d.address, request(6))
    assert d.pool.took.wait(30)
    second, (b,) = _submit(d.address, request(6))
    try:
        while daemon_stats(d.address).joins < 1:
            time.sleep(0.01)
        d.pool.release.set()
        started, joined = a.result(timeout=60), b.result(timeout=60)
        _, (hit,) = _submit(d.address, request(6))
        hit_result = hit.result(timeout=60)
    finally:
        first.close()
        second.close()
    modelled = started.modelled_compile_seconds
    assert modelled > 0 and started.modelled_seconds_waited == modelled
    assert joined.tier == svc.JOINED and 0 < joined.modelled_seconds_waited < modelled
    assert hit_result.tier == svc.MEMORY and hit_result.modelled_seconds_waited == 0
