"""Cache hits a client reads from the daemon's disk tier itself (protos/disk_tier.py,
client/core/direct_reads.py): read-only, digest-checked, never a damaged, half-written or
swapped entry; what it refuses goes to the daemon, which answers right. Real daemons, real
diskcache databases, real files."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import diskcache
import pytest
from trnsim import compiler
from trnsim.client.core import env
from trnsim.client.core.compile_client import DaemonCompileClient, Tier
from trnsim.client.core.direct_reads import DirectReads
from trnsim.daemon.cache import ExecutableCache
from trnsim.protos import disk_tier
from trnsim.protos import executable_pb2 as exe_pb2
from trnsim.protos.blobs import make_blob
from trnsim.protos.disk_tier import DiskReader

from .helpers import daemon_stats, graph, job, start_daemon

pytestmark = pytest.mark.timeout(120)


def _cache(directory: Path) -> ExecutableCache:
    return ExecutableCache(directory, 1 << 20, 64 << 20, retry_s=None)


def _bytes_blob(i: int, size: int) -> tuple[str, object]:
    key = f"{i:064x}"
    return key, make_blob(bytes([i % 251]) * size, compiler.FORMAT_VERSION, key)


def _executable_blob(i: int) -> tuple[str, object]:
    exe = compiler.compile(graph(i), "trn2", exe_pb2.CompileOptions())
    return exe.cache_key, make_blob(exe.SerializeToString(), compiler.FORMAT_VERSION, exe.cache_key)


def _row(directory: Path, key: str) -> tuple[int, str | None]:
    with sqlite3.connect(directory / "cache.db") as db:
        rowid, filename = db.execute(
            "SELECT rowid, filename FROM Cache WHERE key = ?", (disk_tier.EXE + key,)
        ).fetchone()
    return rowid, filename


def _set(directory: Path, key: str, **columns: object) -> None:
    names = ", ".join(f"{k} = ?" for k in columns)
    with sqlite3.connect(directory / "cache.db") as db:
        db.execute(
            f"UPDATE Cache SET {names} WHERE key = ?", (*columns.values(), disk_tier.EXE + key)
        )


def test_the_layout_is_diskcaches():
    assert (disk_tier.MODE_RAW, disk_tier.MODE_BINARY) == (
        diskcache.core.MODE_RAW,
        diskcache.core.MODE_BINARY,
    )
    assert ExecutableCache.EXE == disk_tier.EXE


def test_the_reader_reads_what_the_daemon_wrote_in_rows_and_in_files(tmp_path):
    cache = _cache(tmp_path)
    small, large = _bytes_blob(1, 100), _bytes_blob(2, 40_000)  # (over 32 KiB: a value file)
    for key, blob in (small, large):
        cache.put(key, blob)
    assert _row(tmp_path, large[0])[1], "the large one is kept in a value file"
    reader = DiskReader(tmp_path)
    reads = reader.read([small[0], large[0], f"{3:064x}"])
    assert reads.found == {small[0]: small[1], large[0]: large[1]} and reads.bad == []
    cache.close()
    reader.close()


def test_the_reader_refuses_damaged_half_written_swapped_and_foreign_rows(tmp_path):
    cache = _cache(tmp_path)
    blobs = dict(_bytes_blob(i, 40_000 if i in (4, 5) else 100) for i in range(1, 8))
    for key, blob in blobs.items():
        cache.put(key, blob)
    k1, k2, k3, k4, k5, k6, k7 = blobs
    raw = blobs[k1].SerializeToString()
    _set(tmp_path, k1, value=raw[: len(raw) // 2])  # half of its bytes
    _set(tmp_path, k2, value=blobs[k3].SerializeToString())  # another key's executable
    (tmp_path / _row(tmp_path, k4)[1]).write_bytes(b"\0" * 100)  # its value file cut short
    (tmp_path / _row(tmp_path, k5)[1]).unlink()  # evicted since the row was read: a miss
    _set(tmp_path, k6, mode=disk_tier.MODE_BINARY, value=None, filename="../../x.val")
    _set(tmp_path, k7, mode=4)  # a pickle: never unpickled
    reads = DiskReader(tmp_path).read(list(blobs))
    assert reads.found == {k3: blobs[k3]}
    assert sorted(reads.bad) == sorted([k1, k2, k4, k6, k7])
    cache.close()


def test_a_database_put_in_place_of_the_one_read_is_opened(tmp_path):
    (a, blob_a), (b, blob_b) = _executable_blob(1), _executable_blob(2)
    here, there = _cache(tmp_path / "here"), _cache(tmp_path / "there")
    here.put(a, blob_a)
    there.put(b, blob_b)
    reads = DirectReads(tmp_path / "here")
    assert list(reads.executables([a])) == [a]
    here.close()
    there.close()
    for suffix in ("", "-wal", "-shm"):  # (a damaged database moved aside, a new one made)
        (tmp_path / "here" / f"cache.db{suffix}").unlink(missing_ok=True)
        if (tmp_path / "there" / f"cache.db{suffix}").exists():
            os.replace(
                tmp_path / "there" / f"cache.db{suffix}", tmp_path / "here" / f"cache.db{suffix}"
            )
    reads.executables([b])  # (the file it had open: b is not in it; it sees the new file)
    assert list(reads.executables([b])) == [b] and reads.refused == 0
    reads.close()


def test_a_rank_reads_a_hit_without_asking_the_daemon_and_tells_it_after(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    first = DaemonCompileClient(d.address, auto_start=False)
    rank = DaemonCompileClient(d.address, auto_start=False)
    before = DaemonCompileClient(d.address, auto_start=False, direct_reads=False)
    try:
        made = first.compile(job(1))
        assert made.tier is Tier.COMPILED
        disk = d.cache_dir / "executables"
        accessed = _access_time(disk, job(1).key)
        read = rank.compile(job(1))
        assert read.tier is Tier.DIRECT and read.fetched and rank.tiers == {"DIRECT": 1}
        assert read.executable == made.executable
        assert daemon_stats(d.address).requests == 1, "no request reached the daemon"
        assert before.compile(job(1)).tier is Tier.MEMORY, "with direct reads off: asked"
        rank.close()  # (tells the daemon what it read: its last use, for the LRU order)
        assert daemon_stats(d.address).direct_hits == 1
        assert _access_time(disk, job(1).key) > accessed
    finally:
        first.close()
        before.close()
        d.stop()


def test_half_written_and_swapped_entries_are_never_loaded_and_the_daemon_answers(short_tmp):
    """A rank meets a truncated entry and one holding another key's executable: it loads
    neither, asks the daemon, which meets them too, drops them (counted), compiles and
    answers with the right executables; the next rank reads those from disk."""
    d = start_daemon(short_tmp, "--workers", "1")
    client = DaemonCompileClient(d.address, auto_start=False)
    for i in (1, 2, 3):
        assert client.compile(job(i)).tier is Tier.COMPILED
    client.close()
    d.stop()
    disk = d.cache_dir / "executables"
    rows = _values(disk)
    half = rows[job(1).key]
    _set(disk, job(1).key, value=half[: len(half) // 2])
    _set(disk, job(2).key, value=rows[job(3).key])
    d = start_daemon(short_tmp, "--workers", "1", cache_dir=d.cache_dir)
    rank = DaemonCompileClient(d.address, auto_start=False)
    try:
        for i in (1, 2):
            compiled = rank.compile(job(i))
            assert compiled.tier is Tier.COMPILED, "not loaded from disk: compiled again"
            assert compiled.executable == compiler.compile(
                graph(i), "trn2", exe_pb2.CompileOptions()
            )
        assert rank.compile(job(3)).tier is Tier.DIRECT
        assert rank._disk is not None and rank._disk.refused == 2
        assert daemon_stats(d.address).corrupt_entries == 2
        later = DaemonCompileClient(d.address, auto_start=False)
        assert later.compile(job(1)).tier is Tier.DIRECT, "the daemon wrote it back whole"
        later.close()
    finally:
        rank.close()
        d.stop()


def test_a_cache_open_to_other_users_is_not_read(short_tmp):
    d = start_daemon(short_tmp, "--workers", "1")
    client = DaemonCompileClient(d.address, auto_start=False)
    try:
        client.compile(job(1))
        (d.cache_dir / "executables").chmod(0o777)
        other = DaemonCompileClient(d.address, auto_start=False)
        assert other.compile(job(1)).tier is Tier.MEMORY
        other.close()
    finally:
        (d.cache_dir / "executables").chmod(0o700)
        client.close()
        d.stop()


def test_direct_reads_setting(monkeypatch):
    for value, on in (("", True), ("1", True), ("on", True), ("0", False), ("OFF", False)):
        monkeypatch.setenv(env.NEURON_COMPILE_DIRECT_READS, value)
        assert env.direct_reads() is on
    monkeypatch.setenv(env.NEURON_COMPILE_DIRECT_READS, "maybe")
    with pytest.raises(env.ConfigError, match="use 1"):
        env.direct_reads()


def _values(disk: Path) -> dict[str, bytes]:
    with sqlite3.connect(disk / "cache.db") as db:
        rows = db.execute("SELECT key, value FROM Cache WHERE key LIKE 'exe:%'").fetchall()
    return {k[len(disk_tier.EXE) :]: v for k, v in rows}


def _access_time(disk: Path, key: str) -> float:
    with sqlite3.connect(disk / "cache.db") as db:
        (at,) = db.execute(
            "SELECT access_time FROM Cache WHERE key = ?", (disk_tier.EXE + key,)
        ).fetchone()
    return float(at)


def test_a_runtime_loads_several_cached_graphs_in_one_read(short_tmp):
    """Executables.prefetch: the graphs a shared cache holds are loaded at once (one query, no
    request to the daemon); the one it lacks is compiled when it is asked for."""
    from trnsim.client.core import runtime
    from trnsim.protos import graph_pb2

    d = start_daemon(short_tmp, "--workers", "1")
    first = DaemonCompileClient(d.address, auto_start=False)
    rt = runtime.Runtime(env.read())
    rt.executables.compiler = DaemonCompileClient(d.address, auto_start=False)
    try:
        for i in (1, 2):
            first.compile(job(i))
        debug = graph_pb2.GraphDebug(name="g")
        wanted = [(graph(i), debug, False) for i in (1, 2, 3)]
        assert rt.executables.prefetch(wanted) == 2
        assert daemon_stats(d.address).requests == 2, "read, not asked"
        counts = rt.metrics.counts
        assert counts["executables_fetched"] == 2
        rt.executables.get(graph(1), debug)
        rt.executables.get(graph(3), debug)
        assert counts["executable_cache_hits"] == 1 and counts["executables_compiled"] == 1
        assert rt.executables.prefetch(wanted) == 0, "all loaded already"
    finally:
        first.close()
        rt.close()
        d.stop()
