"""The disk cache under bad conditions: a daemon that starts on a read-only, full or locked
cache.db serves from memory with its disk tier off (and says so); `trnsim cache verify` and
`prune` beside a serving daemon lose nothing and keep the LRU order; rows stamped by a
clock ahead are still evicted and expire; the write-ahead log and a damaged database kept
aside count against the disk limit. Real daemons, real diskcache, real filesystems."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trnsim.cli import main as cli
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.daemon.cache import DAMAGED, OPEN_WAIT_S, ExecutableCache
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import make_blob

from .helpers import DaemonProcess, answers, cache_rows, daemon_stats, request, start_daemon

pytestmark = pytest.mark.timeout(120)
DAY = 86_400.0


def _ok(result: svc.CompileResult) -> bool:
    return result.WhichOneof("outcome") == "executable"


def _blob(i: int, size: int) -> tuple[str, svc.ExecutableBlob]:
    key = f"{i:064x}"
    return key, make_blob(bytes([i % 251]) * size, 1, key)


def _large(i: int, nodes: int = 300) -> svc.CompileRequest:
    """request(i) with a chain of relus: an executable of ~60 KB, over diskcache's 32 KiB,
    so kept in a value file written before its row is committed."""
    b = GraphBuilder(f"chain{i}")
    x = b.input([8, 8 + i])
    for _ in range(nodes):
        x = b.op("aten::relu.default", x, out=TensorType.contiguous([8, 8 + i]))
    r = request(i)
    r.graph.CopyFrom(to_proto(b.build(x)))
    return r


def _warm_cache(root: Path, cache_dir: Path) -> None:
    """A cache with one executable in it (request 1), made by a daemon that then stops."""
    d = start_daemon(root, "--workers", "1", cache_dir=cache_dir)
    try:
        assert _ok(answers(d.address, request(1))[0])
    finally:
        d.stop()


def _serves_from_memory(d: DaemonProcess) -> svc.StatsResponse:
    """The daemon up with its disk tier off: a compile is answered, then served from
    memory; nothing reaches the disk. Returns its stats."""
    first, again = answers(d.address, request(2)), answers(d.address, request(2))
    assert _ok(first[0]) and again[0].tier == svc.MEMORY
    stats = daemon_stats(d.address)
    assert d.proc.poll() is None
    return stats


def _said_once(d: DaemonProcess, what: str) -> None:
    lines = [line for line in d.log.read_text().splitlines() if " is off: " in line]
    assert len(lines) == 1 and what in lines[0], d.log.read_text()
    assert "Traceback" not in d.log.read_text()


# -- starting on a bad cache ------------------------------------------------------------------
def test_start_on_a_read_only_cache(short_tmp, tmpfs):
    """A filesystem remounted read-only under the cache (root ignores a mode bit, not a
    read-only mount): sqlite cannot open the WAL database; the daemon starts without it."""
    disk = tmpfs("ro", size="16m")
    _warm_cache(short_tmp, disk / "cache")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=disk / "cache")
    try:
        stats = _serves_from_memory(d)
        assert "read-only" in stats.disk_tier_off, stats
        _said_once(d, "read-only")
    finally:
        d.stop()
    assert cli(["cache", "--cache-dir", str(disk / "cache"), "verify"]) == 3
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=disk / "never-made")
    try:
        assert "read-only" in _serves_from_memory(d).disk_tier_off, "nor a cache to create"
    finally:
        d.stop()


def _fill(disk: Path) -> None:
    """Writes until the filesystem refuses: ENOSPC from here on."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_start_on_a_full_disk(short_tmp, tmpfs, capsys):
    disk = tmpfs("full", size="1m")
    _warm_cache(short_tmp, disk / "cache")
    _fill(disk)
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=disk / "cache")
    try:
        stats = _serves_from_memory(d)
        assert "disk is full" in stats.disk_tier_off, stats
        _said_once(d, "disk is full")
    finally:
        d.stop()
    assert cli(["cache", "--cache-dir", str(disk / "cache"), "verify"]) == 3
    assert "disk is full" in capsys.readouterr().err


_HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    """A process holding cache.db under BEGIN EXCLUSIVE (as a long VACUUM would)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    with holder.stdout:
        assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.slow
def test_start_on_a_locked_cache(short_tmp):
    cache_dir = short_tmp / "cache"
    _warm_cache(short_tmp, cache_dir)
    holder = _hold_lock(cache_dir / "executables" / "cache.db", 60)
    try:
        began = time.monotonic()
        d = start_daemon(short_tmp, "--workers", "1", cache_dir=cache_dir)
        assert time.monotonic() - began < OPEN_WAIT_S + 10, "waited a bounded time"
        try:
            stats = _serves_from_memory(d)
            assert "locked" in stats.disk_tier_off, stats
            _said_once(d, "locked")
        finally:
            d.stop()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_locked_disk_tier_comes_back_once_the_lock_goes(tmp_path):
    directory = tmp_path / "executables"
    ExecutableCache(directory, 1 << 20, 1 << 24).close()
    holder = _hold_lock(directory / "cache.db", 60)
    cache = ExecutableCache(directory, 1 << 20, 1 << 24, retry_s=0.2)
    try:
        assert "locked" in cache.disk_off and cache.disk is None
        key, blob = _blob(1, 100)
        cache.put(key, blob)
        assert cache.get(key) == (blob, svc.MEMORY)
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 10
        while cache.disk_off and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cache.disk_off == "", "on again"
        key, blob = _blob(2, 100)
        cache.put(key, blob)
        assert cache.keys() == [cache.EXE + key]
    finally:
        holder.kill()
        cache.close()


# -- maintenance beside a serving daemon ------------------------------------------------------
def test_verify_and_prune_beside_a_serving_daemon_lose_nothing(daemon):
    """Compiles stored while verify and prune run over and over (executables in value
    files, which diskcache writes before their rows): every one is kept and readable, and
    no row's access time moved."""
    count = 40
    cache_dir = ["cache", "--cache-dir", str(daemon.cache_dir)]
    assert _ok(answers(daemon.address, request(0))[0])
    done = threading.Event()
    runs = []

    def maintain() -> None:
        while not done.is_set():
            runs.append(cli([*cache_dir, "verify"]))
            runs.append(cli([*cache_dir, "prune"]))

    thread = threading.Thread(target=maintain)
    thread.start()
    try:
        results = answers(daemon.address, *[_large(i) for i in range(1, count + 1)])
    finally:
        done.set()
        thread.join(timeout=60)
    assert all(_ok(r) for r in results) and len(runs) >= 2
    assert set(runs) == {0}, "nothing found corrupt, nothing failed"
    rows = cache_rows(daemon.cache_dir)
    assert len(rows) == count + 1, "every executable kept"
    files = list((daemon.cache_dir / "executables").glob("*/*/*.val"))
    assert len(files) >= count, "(the test stores its executables in value files)"
    before = _access_times(daemon.cache_dir)
    assert cli([*cache_dir, "verify"]) == 0 and cli([*cache_dir, "prune"]) == 0
    assert cli([*cache_dir, "ls"]) == 0
    after = _access_times(daemon.cache_dir)  # (the daemon may still add rows: "parts:")
    assert {k: after.get(k) for k in before} == before, "the LRU order is the daemon's"
    again = answers(daemon.address, *[_large(i) for i in range(1, count + 1)])
    assert {r.tier for r in again} <= {svc.MEMORY, svc.DISK}


def _access_times(cache_dir: Path) -> dict[str, float]:
    with sqlite3.connect(cache_dir / "executables" / "cache.db") as db:
        return dict(db.execute("SELECT key, access_time FROM Cache"))


# -- clocks, the WAL, damaged databases --------------------------------------------------------
def _shift(directory: Path, seconds: float, keys: list[str]) -> None:
    """Rows as a clock `seconds` ahead would have stamped them."""
    with sqlite3.connect(directory / "cache.db") as db:
        for key in keys:
            db.execute(
                "UPDATE Cache SET store_time = store_time + ?, access_time = access_time + ?, "
                "expire_time = expire_time + ? WHERE key = ?",
                (seconds, seconds, seconds, key),
            )


def test_rows_stamped_by_a_clock_ahead_are_evicted_and_expire(tmp_path):
    directory = tmp_path / "executables"
    cache = ExecutableCache(directory, 1 << 20, 256 << 10)
    ahead = [_blob(i, 8000) for i in range(4)]
    for key, blob in ahead:
        cache.put(key, blob)
    error = svc.CompileError(error_class=svc.INVALID_REQUEST, message="no such op")
    cache.put_error("e" * 64, error, ttl_s=1.0)
    cache.close()
    _shift(directory, DAY, [cache.EXE + k for k, _ in ahead] + [cache.ERR + "e" * 64])
    cache = ExecutableCache(directory, 1 << 20, 256 << 10)  # (a later run, the clock right)
    try:
        assert cache.get_error("e" * 64) == error, "within its TTL"
        for i in range(4, 100):  # ~780 KB through a 256 KiB tier
            cache.put(*_blob(i, 8000))
        left = set(cache.keys())
        assert not left & {cache.EXE + k for k, _ in ahead}, "evicted like any other"
        time.sleep(1.1)
        assert cache.get_error("e" * 64) is None, "a day ahead did not outlive a 1 s TTL"
    finally:
        cache.close()


def _bytes_in(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_the_wal_counts_against_the_disk_limit(tmp_path):
    """1 MiB of limit, 3 MB written in small entries (they live in the database, so every
    write goes through the WAL): what the directory holds stays near the limit."""
    directory = tmp_path / "executables"
    cache = ExecutableCache(directory, 1 << 20, 1 << 20)
    try:
        for i in range(400):
            cache.put(*_blob(i, 8000))
        entries, volume = cache.disk_stats()
        on_disk = _bytes_in(directory) - 32 * 1024  # (less the -shm index: memory, not data)
        assert volume <= (1 << 20) * 1.05 and on_disk <= (1 << 20) * 1.1, (volume, on_disk)
        assert entries > 50
    finally:
        cache.close()


def test_only_the_newest_damaged_database_is_kept_and_counted(tmp_path):
    directory = tmp_path / "executables"
    directory.mkdir(mode=0o700)
    for stamp in ("20250101T000000-1", "20250102T000000-1"):
        (directory / f"{DAMAGED}{stamp}").write_bytes(b"old damage " * 1000)
        (directory / f"{DAMAGED}{stamp}-wal").write_bytes(b"x" * 100)
    (directory / "cache.db").write_bytes(b"not a database, " * 512)  # 8 KB, moved aside now
    cache = ExecutableCache(directory, 1 << 20, 1 << 20)
    try:
        kept = sorted(p.name for p in directory.glob(DAMAGED + "*"))
        assert len(kept) == 1 and not kept[0].startswith(f"{DAMAGED}2025"), kept
        _, volume = cache.disk_stats()
        assert volume >= 8192 + cache.tier()._page_size, "the kept one counts"
    finally:
        cache.close()


def test_a_damaged_database_too_large_to_keep_is_deleted(tmp_path):
    directory = tmp_path / "executables"
    directory.mkdir(mode=0o700)
    (directory / "cache.db").write_bytes(b"not a database, " * 32 * 1024)  # 512 KiB
    cache = ExecutableCache(directory, 1 << 20, 1 << 20)  # (a quarter: 256 KiB)
    try:
        assert list(directory.glob(DAMAGED + "*")) == []
    finally:
        cache.close()
    assert os.path.exists(directory / "cache.db")
