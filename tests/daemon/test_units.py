"""The daemon's parts on their own, in process: the executable cache (memory LRU over a
real diskcache in a temporary directory), the in-flight table (one job per key, waiters,
priorities, withdrawals, closed streams) and the worker pool (real worker processes)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest
from trnsim.daemon.cache import ExecutableCache, MemoryLRU
from trnsim.daemon.inflight import RECENT_FINISHES, InFlight, Submitted, Waiter
from trnsim.daemon.workers import WorkerPool
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import make_blob

from .helpers import request, worker_processes

KEY_A, KEY_B, KEY_C = ("a" * 64, "b" * 64, "c" * 64)


def _blob(key: str, size: int = 100) -> svc.ExecutableBlob:
    return make_blob(bytes([len(key) % 251]) * size, 1, key)


@pytest.fixture
def cache(tmp_path):
    c = ExecutableCache(tmp_path / "executables", memory_bytes=1 << 20, disk_bytes=1 << 24)
    yield c
    c.close()


# -- the cache -------------------------------------------------------------------------------------
def test_memory_lru_evicts_the_least_recently_used_over_capacity():
    lru = MemoryLRU(capacity=250)
    for key in (KEY_A, KEY_B):
        lru.put(key, _blob(key), 100)
    assert lru.get(KEY_A) is not None  # A is now the most recent
    lru.put(KEY_C, _blob(KEY_C), 100)
    assert KEY_B not in lru and KEY_A in lru and KEY_C in lru
    assert lru.nbytes == 200 and lru.counters.evictions == 1
    lru.put("d" * 64, _blob("d" * 64), 1000)  # larger than the whole tier: not kept
    assert len(lru) == 2 and lru.nbytes == 200


def test_a_put_is_served_from_memory_then_from_disk_after_a_restart(tmp_path):
    directory = tmp_path / "executables"
    c = ExecutableCache(directory, memory_bytes=1 << 20, disk_bytes=1 << 24, tag="v1")
    c.put(KEY_A, _blob(KEY_A))
    assert c.get(KEY_A) == (_blob(KEY_A), svc.MEMORY)
    c.close()
    c = ExecutableCache(directory, memory_bytes=1 << 20, disk_bytes=1 << 24, tag="v1")
    try:
        assert c.memory_get(KEY_A) is None
        assert c.get(KEY_A) == (_blob(KEY_A), svc.DISK)
        assert c.memory_get(KEY_A) == _blob(KEY_A), "a disk hit is promoted to memory"
        assert c.get(KEY_B) is None
    finally:
        c.close()


def test_an_entry_stored_under_another_key_is_dropped_not_served(cache):
    """The digest binds the bytes to their key: B's executable under A's key is refused."""
    cache.disk.set(cache.EXE + KEY_A, _blob(KEY_B).SerializeToString())
    assert cache.get(KEY_A) is None and cache.corrupt == 1
    assert cache.disk.get(cache.EXE + KEY_A) is None, "deleted from disk"


def test_errors_are_remembered_until_they_expire(cache):
    error = svc.CompileError(error_class=svc.INVALID_REQUEST, message="no such op")
    cache.put_error(KEY_A, error, ttl_s=60)
    assert cache.get_error(KEY_A) == error
    cache.put_error(KEY_B, error, ttl_s=-1)  # already expired
    assert cache.get_error(KEY_B) is None


def test_verify_and_prune(cache):
    cache.put(KEY_A, _blob(KEY_A))
    cache.disk.set(cache.EXE + KEY_B, _blob(KEY_C).SerializeToString())  # swapped
    cache.disk.set(cache.EXE + KEY_C, _blob(KEY_C).SerializeToString(), tag="old version")
    assert cache.verify() == (2, 1)
    other = ExecutableCache(cache.directory, 1 << 20, 1 << 24, tag="new version")
    try:
        assert other.prune() == 2 and other.keys() == []
    finally:
        other.close()


def test_cache_commands_on_a_missing_directory_create_nothing(tmp_path, capsys):
    from trnsim.cli import main

    missing = tmp_path / "nowhere"
    for command in ("ls", "verify"):
        assert main(["cache", "--cache-dir", str(missing), command]) == 2
        assert "no executable cache at" in capsys.readouterr().err
    assert not missing.exists()


def test_a_disk_that_fails_costs_only_the_disk_tier(cache, monkeypatch):
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(cache.disk, "set", refuse)
    cache.put(KEY_A, _blob(KEY_A))
    assert cache.get(KEY_A) == (_blob(KEY_A), svc.MEMORY) and cache.disk_errors == 1


def test_a_damaged_database_is_moved_aside(tmp_path):
    directory = tmp_path / "executables"
    directory.mkdir(mode=0o700)
    (directory / "cache.db").write_bytes(b"garbage " * 1024)
    c = ExecutableCache(directory, memory_bytes=1 << 20, disk_bytes=1 << 24)
    try:
        assert len(list(directory.glob("cache.db.damaged-*"))) == 1
        c.put(KEY_A, _blob(KEY_A))
        assert c.keys() == [c.EXE + KEY_A]
    finally:
        c.close()


def test_a_cache_db_deleted_under_an_open_cache_is_made_again(tmp_path):
    """SQLite raises nothing when its file is unlinked (it writes on to the deleted inode):
    the cache notices by the file, makes a new cache.db, and what it keeps next lasts."""
    directory = tmp_path / "executables"
    c = ExecutableCache(directory, memory_bytes=1 << 20, disk_bytes=1 << 24)
    try:
        c.put(KEY_A, _blob(KEY_A))
        (directory / "cache.db").unlink()
        c.put(KEY_B, _blob(KEY_B))
        assert (directory / "cache.db").exists()
    finally:
        c.close()
    again = ExecutableCache(directory, memory_bytes=1 << 20, disk_bytes=1 << 24)
    try:
        assert again.get(KEY_B) == (_blob(KEY_B), svc.DISK)
        assert again.get(KEY_A) is None, "lost with the deleted file: a cache loses entries"
    finally:
        again.close()


# -- the in-flight table ---------------------------------------------------------------------------
def _waiter(stream: int, request_id: int, got: list[svc.CompileResult], priority=svc.BLOCKING):  # type: ignore[no-untyped-def]
    return Waiter(stream, request_id, priority, got.append)


def _request() -> svc.CompileRequest:
    return svc.CompileRequest(target="trn2")


def test_one_job_per_key_and_every_waiter_answered_under_its_own_id():
    table, got = InFlight(), []
    table.open_stream(1)
    table.open_stream(2)
    assert table.submit(KEY_A, _request(), _waiter(1, 10, got)) is Submitted.QUEUED
    assert table.submit(KEY_A, _request(), _waiter(2, 20, got)) is Submitted.JOINED
    assert table.counts() == (1, 0, 2) and table.joins == 1
    job = table.next_job(timeout=1)
    assert job is not None and job.key == KEY_A and table.counts() == (0, 1, 2)
    result = svc.CompileResult(executable=_blob(KEY_A), tier=svc.COMPILED)
    assert table.finish(job, result) == 2
    assert sorted((r.id, r.tier) for r in got) == [(10, svc.COMPILED), (20, svc.JOINED)]
    assert table.counts() == (0, 0, 0)


def test_a_request_that_missed_the_cache_as_its_key_finished_looks_again_not_compiles():
    table, got = InFlight(), []
    table.open_stream(1)
    table.open_stream(2)
    table.submit(KEY_A, _request(), _waiter(1, 1, got))
    job = table.next_job(timeout=1)
    assert job is not None
    late = table.ticket()  # stream 2 looks in the cache now: a miss, the job still runs
    before_b = table.ticket()
    table.finish(job, svc.CompileResult(executable=_blob(KEY_A), tier=svc.COMPILED))
    assert table.submit(KEY_A, _request(), _waiter(2, 1, got), late) is Submitted.FINISHED
    assert table.counts() == (0, 0, 0) and table.relooked == 1, "no second job of KEY_A"
    # another key's finish sends nobody back; without a ticket (the last try) it queues
    assert table.submit(KEY_B, _request(), _waiter(2, 2, got), before_b) is Submitted.QUEUED
    assert table.submit(KEY_A, _request(), _waiter(2, 3, got)) is Submitted.QUEUED
    assert table.submit(KEY_C, _request(), _waiter(2, 4, got), table.ticket()) is Submitted.QUEUED


def test_a_ticket_older_than_what_the_table_remembers_looks_again():
    table, got = InFlight(), []
    table.open_stream(1)
    old = table.ticket()
    for i in range(RECENT_FINISHES + 1):
        key = f"{i:064x}"
        table.submit(key, _request(), _waiter(1, i, got))
        job = table.next_job(timeout=1)
        assert job is not None
        table.finish(job, svc.CompileResult(executable=_blob(key), tier=svc.COMPILED))
    assert table.submit(KEY_A, _request(), _waiter(1, 0, got), old) is Submitted.FINISHED


def test_blocking_jobs_go_before_background_ones():
    table, got = InFlight(), []
    table.open_stream(1)
    table.submit(KEY_A, _request(), _waiter(1, 1, got, svc.BACKGROUND))
    table.submit(KEY_B, _request(), _waiter(1, 2, got, svc.BLOCKING))
    first = table.next_job(timeout=1)
    assert first is not None and first.key == KEY_B


def test_a_queued_job_whose_waiters_all_left_is_dropped():
    table, got = InFlight(), []
    table.open_stream(1)
    table.submit(KEY_A, _request(), _waiter(1, 1, got))
    table.withdraw(1, 1)
    assert table.counts() == (0, 0, 0) and table.dropped == 1
    assert table.next_job(timeout=0.05) is None


def test_a_background_job_whose_process_ended_is_compiled_for_the_cache_after_the_rest():
    table, got = InFlight(), []
    for stream in (1, 2, 3):
        table.open_stream(stream)
    table.submit(KEY_A, _request(), _waiter(1, 1, got, svc.BACKGROUND))
    table.submit(KEY_B, _request(), _waiter(2, 1, got, svc.BLOCKING))
    table.submit(KEY_C, _request(), _waiter(3, 1, got, svc.BACKGROUND))
    table.withdraw(3, 1)  # a cancelled request: nobody wants it
    table.close_stream(1)  # the process that asked for KEY_A exited
    table.close_stream(2)
    assert table.counts() == (1, 0, 0) and table.dropped == 2, "only KEY_A stays"
    job = table.next_job(timeout=1)
    assert job is not None and job.key == KEY_A
    table.requeue(job)  # (its worker died): tried again all the same
    job = table.next_job(timeout=1)
    assert job is not None and job.key == KEY_A
    assert table.finish(job, svc.CompileResult(executable=_blob(KEY_A))) == 0 and not got


def test_a_running_job_outlives_its_waiters_and_a_requeued_one_without_them_goes():
    table, got = InFlight(), []
    table.open_stream(1)
    table.submit(KEY_A, _request(), _waiter(1, 1, got))
    job = table.next_job(timeout=1)
    assert job is not None
    table.close_stream(1)
    assert table.counts() == (0, 1, 0), "running: kept until the worker is done"
    table.requeue(job)  # (its worker died): nobody waits, so it is not run again
    assert table.counts() == (0, 0, 0) and table.dropped == 1


def test_waiters_of_closed_streams_and_cancelled_requests_are_refused():
    table, got = InFlight(), []
    assert table.submit(KEY_A, _request(), _waiter(9, 1, got)) is Submitted.REFUSED  # never opened
    table.open_stream(1)
    table.expect(1, 5)
    table.withdraw(1, 5)  # cancelled while on its way
    table.submit(KEY_A, _request(), _waiter(1, 5, got))
    assert table.counts() == (0, 0, 0) and table.refused == 2
    table.expect(1, 5)  # the id sent again: a new request
    table.submit(KEY_A, _request(), _waiter(1, 5, got))
    assert table.counts() == (1, 0, 1)


def test_draining_hands_queued_jobs_back_as_cancelled():
    table, got = InFlight(), []
    table.open_stream(1)
    table.submit(KEY_A, _request(), _waiter(1, 1, got))
    table.submit(KEY_B, _request(), _waiter(1, 2, got))
    running = table.next_job(timeout=1)
    assert running is not None
    queued_id = 2 if running.key == KEY_A else 1
    assert table.cancel_queued("shutting down") == 1
    assert [(r.id, r.error.error_class) for r in got] == [(queued_id, svc.CANCELLED)]
    assert table.counts() == (0, 1, 1), "the running job finishes"


def test_next_job_wakes_when_work_arrives_and_when_the_table_closes():
    table, got = InFlight(), []
    table.open_stream(1)
    jobs: list[object] = []
    worker = threading.Thread(target=lambda: jobs.append(table.next_job(timeout=30)))
    worker.start()
    table.submit(KEY_A, _request(), _waiter(1, 1, got))
    worker.join(timeout=30)
    assert len(jobs) == 1 and jobs[0] is not None
    closer = threading.Thread(target=lambda: jobs.append(table.next_job(timeout=30)))
    closer.start()
    table.close()
    closer.join(timeout=30)
    assert jobs[1] is None


# -- the worker pool (real worker processes, no server) --------------------------------------------
def _pool(size: int = 1, timeout_s: float = 60.0):  # type: ignore[no-untyped-def]
    table = InFlight()
    return table, WorkerPool(size, table, table.finish, timeout_s)


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.05)


def _compile_job(table: InFlight, key: str, got: list[svc.CompileResult], **options) -> None:  # type: ignore[no-untyped-def]
    req = request(1, **options)
    table.submit(key, req, _waiter(1, len(got), got))


def test_the_pool_compiles_and_replaces_a_worker_that_died_idle():
    table, pool = _pool()
    table.open_stream(1)
    got: list[svc.CompileResult] = []
    try:
        _compile_job(table, KEY_A, got)
        _wait(lambda: len(got) == 1, "the first compile")
        assert got[0].WhichOneof("outcome") == "executable"
        workers = worker_processes(os.getpid())
        assert len(workers) == 1
        workers[0].kill()
        _wait(lambda: pool.restarts == 1, "the idle worker's death noticed")
        _compile_job(table, KEY_B, got)
        _wait(lambda: len(got) == 2, "a compile on the new worker")
        assert got[1].WhichOneof("outcome") == "executable" and pool.alive() == 1
    finally:
        pool.stop()


def test_a_job_that_kills_its_worker_twice_is_answered_transient_and_one_over_time_timeout():
    table, pool = _pool(timeout_s=1.0)
    table.open_stream(1)
    got: list[svc.CompileResult] = []
    try:
        _compile_job(table, KEY_A, got, debug_crash_worker=True)
        _wait(lambda: len(got) == 1, "the crashing job answered")
        assert got[0].error.error_class == svc.TRANSIENT and "died twice" in got[0].error.message
        _compile_job(table, KEY_B, got, debug_sleep_ms=5000)
        _wait(lambda: len(got) == 2, "the slow job answered")
        assert got[1].error.error_class == svc.TIMEOUT
        assert pool.restarts == 3 and pool.alive() == 1  # two crashes and a kill, all replaced
    finally:
        pool.stop()


def test_background_jobs_never_take_the_last_free_worker():
    """With one background slot (two workers), a second background job waits while one
    runs; a blocking job still starts."""
    table, got = InFlight(), []
    table.open_stream(1)
    table.submit(KEY_A, _request(), _waiter(1, 1, got, svc.BACKGROUND))
    table.submit(KEY_B, _request(), _waiter(1, 2, got, svc.BACKGROUND))
    first = table.next_job(timeout=1, background_slots=1)
    assert first is not None and first.key == KEY_A
    assert table.next_job(timeout=0.05, background_slots=1) is None, "KEY_B waits"
    table.submit(KEY_C, _request(), _waiter(1, 3, got, svc.BLOCKING))
    blocking = table.next_job(timeout=1, background_slots=1)
    assert blocking is not None and blocking.key == KEY_C
    table.finish(first, svc.CompileResult(executable=_blob(KEY_A)))
    second = table.next_job(timeout=1, background_slots=1)
    assert second is not None and second.key == KEY_B
