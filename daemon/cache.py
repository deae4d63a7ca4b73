"""Executable caches: a memory LRU bounded in bytes in front of a disk cache (diskcache)
bounded in bytes with LRU eviction. Every entry carries a sha256 checked on read; values
are protobuf bytes, never pickles (BytesDisk refuses anything else)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
from google.protobuf.message import DecodeError
from trnsim.daemon.config import ensure_private_dir
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import blob_ok

log = logging.getLogger(__name__)


class UnsafeEntry(ValueError):
    """A cache row that is not ours to read: a pickled value or key (a planted or foreign
    entry). Refused without unpickling; the row is dropped."""


class BytesDisk(diskcache.Disk):  # type: ignore[misc]
    """diskcache storage that holds str keys and bytes values only: nothing is pickled, and a
    pickled row found on disk (planted, or from another program) is refused, never loaded."""

    def put(self, key: Any) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"cache keys are str, not {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise UnsafeEntry("a pickled key in the cache database")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not isinstance(value, bytes):
            raise TypeError(f"cache values are bytes, not {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY):
            raise UnsafeEntry(f"a cache row of mode {mode} (pickled or text): trnsim stores bytes")
        return super().fetch(mode, filename, value, read)


# What a failing disk tier raises: it then answers misses and skips writes (the memory tier
# and compiling still work), and says so in the log and the `disk_errors` counter.
_DISK_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout, UnsafeEntry)
MAX_ERRORS_IN_MEMORY = 10_000


@dataclass
class TierCounters:
    hits: int = 0
    evictions: int = 0

    def to_proto(self, entries: int, nbytes: int) -> svc.TierStats:
        return svc.TierStats(
            hits=self.hits, entries=entries, bytes=nbytes, evictions=self.evictions
        )


class MemoryLRU:
    """Key -> verified blob, least recently used evicted first once over `capacity` bytes.

    Blobs enter only after their digest was checked (fresh from a worker or read from
    disk), so a memory hit is served without hashing again."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = 0
        self._items: OrderedDict[str, tuple[svc.ExecutableBlob, int]] = OrderedDict()
        self.counters = TierCounters()

    def get(self, key: str) -> svc.ExecutableBlob | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, blob: svc.ExecutableBlob, size: int) -> None:
        if size > self.capacity:
            return
        self.discard(key)
        self._items[key] = (blob, size)
        self.nbytes += size
        while self.nbytes > self.capacity:
            _, (_, evicted) = self._items.popitem(last=False)
            self.nbytes -= evicted
            self.counters.evictions += 1

    def discard(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items


class ExecutableCache:
    """memory LRU -> disk. get() answers (blob, tier) or None; bad entries are dropped."""

    EXE = "exe:"
    ERR = "err:"
    PARTS = "parts:"  # a compiled key's parts (svc.KeyParts): what `Nearest` compares

    def __init__(self, directory: Path, memory_bytes: int, disk_bytes: int, tag: str = "") -> None:
        ensure_private_dir(directory)  # never through a symlink, never someone else's
        self.directory = directory
        self.tag = tag  # the compiler version: prune drops entries of other versions
        self.disk_bytes = disk_bytes
        self.memory = MemoryLRU(memory_bytes)
        fresh = not (directory / "cache.db").exists()
        self.disk, replaced = self._open_intact()
        self._db_id = self._db_identity()
        fresh = fresh or replaced
        self.disk_counters = TierCounters()
        self.corrupt = 0
        self.disk_errors = 0
        # key -> (expires at, CompileError bytes), oldest first, bounded
        self._errors: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()  # the memory tier and the error table
        self._disk_lock = threading.RLock()  # the disk tier: one operation at a time
        if fresh:
            self._disk(lambda: self.disk.check(fix=True), None)  # files a lost cache.db left

    def _open(self) -> diskcache.Cache:
        # Small values live in the database itself (bytes on disk close to bytes counted);
        # every value, wherever it lives, carries its digest. A busy database (another
        # process: `trnsim cache ...`) is a miss after a second, not a stalled request.
        return diskcache.Cache(
            str(self.directory),
            size_limit=self.disk_bytes,
            eviction_policy="least-recently-used",
            disk=BytesDisk,
            cull_limit=16,
            timeout=1.0,
        )

    def _open_intact(self) -> tuple[diskcache.Cache, bool]:
        """The disk tier, and whether a damaged cache.db had to be replaced: one that is not
        a database (garbled, truncated, overwritten) is moved aside, kept for a post-mortem,
        and an empty one takes its place. A cache loses entries, never the daemon."""
        try:
            return self._open(), False
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):
                raise  # (locked, read-only, no such directory: not the file's damage)
            self._move_aside(e)
            return self._open(), True

    def _move_aside(self, error: Exception) -> None:
        db = self.directory / "cache.db"
        aside = db.with_name(f"cache.db.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        os.replace(db, aside)
        for suffix in ("-wal", "-shm"):  # (its journal belongs to it)
            journal = db.with_name(db.name + suffix)
            if journal.exists():
                os.replace(journal, aside.with_name(aside.name + suffix))
        log.warning("disk cache %s: cache.db is damaged (%s), moved to %s", db.parent, error, aside)

    def _db_identity(self) -> tuple[int, int] | None:
        """The open database file as (device, inode); None when cache.db is not there."""
        try:
            st = os.stat(self.directory / "cache.db")
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _disk(self, call: Any, default: Any) -> Any:
        """A disk-tier operation, one at a time; whatever makes it fail (read-only, full,
        deleted or garbled database, a bug in diskcache) is logged and counted, `default`
        stands in, and the tier is reopened when its database is gone or in doubt.

        A cache.db deleted or replaced under the daemon raises nothing (SQLite goes on
        writing to the unlinked file, lost at exit), so each operation first checks that the
        file at the path is still the one open (one stat) and reopens the tier if not."""
        with self._disk_lock:
            if self._db_identity() != self._db_id:
                log.warning("disk cache %s: cache.db was deleted or replaced", self.directory)
                self._reopen()
            try:
                return call()
            except Exception as e:  # noqa: BLE001  (the disk tier is a cache: it may fail)
                self.disk_errors += 1
                if self.disk_errors <= 3 or self.disk_errors % 100 == 0:
                    log.warning(
                        "disk cache %s: %s: %s (%d disk errors so far)",
                        self.directory,
                        type(e).__name__,
                        e,
                        self.disk_errors,
                    )
                expected = isinstance(e, _DISK_ERRORS)
                damaged = isinstance(e, sqlite3.DatabaseError) and not isinstance(
                    e, sqlite3.OperationalError
                )
                if not expected or damaged or not (self.directory / "cache.db").exists():
                    self._reopen()
                return default

    def _reopen(self) -> None:
        """A fresh connection (and database, if cache.db was deleted under us); an open
        transaction of the old one is rolled back with it. The memory tier is kept."""
        try:
            old, self.disk = self.disk, self._open_intact()[0]
            self._db_id = self._db_identity()
            old.close()
            log.warning("disk cache %s reopened", self.directory)
        except Exception as e:  # noqa: BLE001
            log.warning("disk cache %s cannot be reopened: %s", self.directory, e)

    # -- executables ----------------------------------------------------------------------------
    def memory_get(self, key: str) -> svc.ExecutableBlob | None:
        """The memory tier alone (never blocks on disk): for answering on the event loop."""
        with self._lock:
            blob = self.memory.get(key)
        if blob is not None:
            self.memory.counters.hits += 1
        return blob

    def has(self, key: str) -> bool:
        """Whether either tier holds the key's executable (read nothing, promote nothing)."""
        return self.memory_has(key) or bool(self._disk(lambda: self.EXE + key in self.disk, False))

    def memory_has(self, key: str) -> bool:
        with self._lock:
            return key in self.memory

    def get(self, key: str) -> tuple[svc.ExecutableBlob, svc.CacheTier] | None:
        with self._lock:
            cached = self.memory.get(key)
        if cached is not None:
            self.memory.counters.hits += 1
            return cached, svc.MEMORY
        raw = self._disk_get(self.EXE + key)
        if raw is None:
            return None
        try:
            blob = svc.ExecutableBlob.FromString(raw)
        except Exception:  # noqa: BLE001  (a truncated or garbled entry)
            blob = svc.ExecutableBlob()
        if not blob_ok(blob, key):
            self._drop(key)
            return None
        self.disk_counters.hits += 1
        with self._lock:
            self.memory.put(key, blob, len(raw))
        return blob, svc.DISK

    def put(self, key: str, blob: svc.ExecutableBlob) -> None:
        """Stores a blob whose digest the caller has checked (a worker just made it). A disk
        that refuses it (read-only, full, gone) leaves it in memory only."""
        raw = blob.SerializeToString()
        with self._lock:
            self.memory.put(key, blob, len(raw))

        def store() -> None:
            before = len(self.disk)
            self.disk.set(self.EXE + key, raw, tag=self.tag or None)
            self.disk_counters.evictions += max(0, before + 1 - len(self.disk))

        self._disk(store, None)

    def _disk_get(self, disk_key: str) -> bytes | None:
        """A row's bytes; a row that cannot be read as ours (garbled, pickled) is dropped."""

        def read() -> bytes | None:
            try:
                value = self.disk.get(disk_key, default=None)
            except (TypeError, ValueError) as e:  # (UnsafeEntry among them)
                log.warning("disk cache: dropping the unreadable entry %s (%s)", disk_key[:24], e)
                self.disk.delete(disk_key)
                self.corrupt += 1
                return None
            return value if isinstance(value, bytes) else None

        return self._disk(read, None)  # type: ignore[no-any-return]

    def _drop(self, key: str) -> None:
        """A corrupt entry: deleted everywhere and counted; the caller recompiles."""
        self.corrupt += 1
        with self._lock:
            self.memory.discard(key)
        self._disk(lambda: self.disk.delete(self.EXE + key), None)

    # -- deterministic compile errors, remembered for a while ------------------------------------
    def get_error(self, key: str) -> svc.CompileError | None:
        with self._lock:
            entry = self._errors.get(key)
        raw = entry[1] if entry is not None and entry[0] > time.time() else None
        if raw is None:
            raw = self._disk_get(self.ERR + key)
        if raw is None:
            return None
        try:
            return svc.CompileError.FromString(raw)
        except DecodeError:
            self.corrupt += 1
            with self._lock:
                self._errors.pop(key, None)
            self._disk(lambda: self.disk.delete(self.ERR + key), None)
            return None

    def put_error(self, key: str, error: svc.CompileError, ttl_s: float) -> None:
        raw = error.SerializeToString()
        with self._lock:
            self._errors[key] = (time.time() + ttl_s, raw)
            self._errors.move_to_end(key)
            while len(self._errors) > MAX_ERRORS_IN_MEMORY:
                self._errors.popitem(last=False)
        self._disk(
            lambda: self.disk.set(self.ERR + key, raw, expire=ttl_s, tag=self.tag or None), None
        )

    # -- the parts of compiled keys (explaining a miss) -------------------------------------------
    def put_parts(self, parts: svc.KeyParts) -> None:
        raw = parts.SerializeToString()
        self._disk(
            lambda: self.disk.set(self.PARTS + parts.cache_key, raw, tag=self.tag or None), None
        )

    def all_parts(self, limit: int) -> list[tuple[float, svc.KeyParts]]:
        """(stored at, parts) of the newest `limit` compiled keys, newest first: one query that
        reads the rows as they are (no access-time writes; a row that is not inline or not
        KeyParts is skipped: `trnsim cache verify` drops bad ones)."""

        def read() -> list[tuple[float, svc.KeyParts]]:
            rows = self.disk._sql(
                "SELECT store_time, value FROM Cache WHERE key >= ? AND key < ? "
                "ORDER BY store_time DESC LIMIT ?",
                (self.PARTS, self.PARTS[:-1] + chr(ord(":") + 1), limit),
            ).fetchall()
            out = []
            for at, value in rows:
                if not isinstance(value, bytes):
                    continue
                try:
                    out.append((float(at), svc.KeyParts.FromString(value)))
                except DecodeError:
                    continue
            return out

        return self._disk(read, [])  # type: ignore[no-any-return]

    # -- maintenance (trnsim cache ...) ------------------------------------------------------------
    def keys(self) -> list[str]:
        """Every key on disk. Rows whose key is not a plain string (pickled: planted or
        foreign) are deleted, never loaded."""
        rows = self.disk._sql("SELECT rowid, key, raw FROM Cache").fetchall()
        keys = []
        for rowid, key, raw in rows:
            if raw and isinstance(key, str):
                keys.append(key)
            else:
                log.warning("disk cache: deleting a row with a pickled key (rowid %d)", rowid)
                self.disk._sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                self.corrupt += 1
        return keys

    def entries(self) -> Iterator[tuple[str, int, str]]:
        """(key, bytes, compiler version) of every executable on disk."""
        for disk_key in self.keys():
            if not disk_key.startswith(self.EXE):
                continue
            try:
                value, tag = self.disk.get(disk_key, default=None, tag=True)
            except _DISK_ERRORS:
                continue  # (verify drops it)
            if value is not None:
                yield disk_key[len(self.EXE) :], len(value), tag or ""

    def verify(self) -> tuple[int, int]:
        """Checks every disk entry: an executable's digest against its own key (a swapped
        entry fails), an error's encoding; deletes bad ones. Returns (good, bad)."""
        good = bad = 0
        for disk_key in self.keys():
            before = self.corrupt
            raw = self._disk_get(disk_key)
            if raw is None:
                bad += self.corrupt - before
                continue
            if _entry_ok(disk_key, raw):
                good += 1
            else:
                bad += 1
                self._drop_disk_key(disk_key)
        self.disk.check(fix=True)  # files no row refers to (a lost cache.db left them)
        return good, bad

    def _drop_disk_key(self, disk_key: str) -> None:
        if disk_key.startswith(self.EXE):
            self._drop(disk_key[len(self.EXE) :])
        else:
            self.corrupt += 1
            self.disk.delete(disk_key)

    def prune(self) -> int:
        """Drops expired errors, entries of other compiler versions and files no row refers
        to; returns how many entries went."""
        removed = int(self.disk.expire())
        for disk_key in self.keys():
            try:
                _, tag = self.disk.get(disk_key, default=None, tag=True)
            except _DISK_ERRORS:
                tag = None
            if self.tag and tag != self.tag:
                self.disk.delete(disk_key)
                removed += 1
        self.disk.cull()
        self.disk.check(fix=True)
        return removed

    def clear(self) -> int:
        with self._lock:
            self.memory.clear()
            self._errors.clear()
        return int(self.disk.clear())

    def disk_stats(self) -> tuple[int, int]:
        """(executables and remembered errors on disk, bytes the disk tier uses)."""

        def read() -> tuple[int, int]:
            parts = self.disk._sql(
                "SELECT COUNT(*) FROM Cache WHERE key >= ? AND key < ?",
                (self.PARTS, self.PARTS[:-1] + chr(ord(":") + 1)),
            ).fetchone()[0]
            return len(self.disk) - int(parts), int(self.disk.volume())

        return self._disk(read, (0, 0))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.disk.close()


def _entry_ok(disk_key: str, raw: bytes) -> bool:
    """An executable whose digest binds it to its own key, or a readable error."""
    try:
        if disk_key.startswith(ExecutableCache.EXE):
            blob = svc.ExecutableBlob.FromString(raw)
            return blob_ok(blob, disk_key[len(ExecutableCache.EXE) :])
        if disk_key.startswith(ExecutableCache.PARTS):
            return svc.KeyParts.FromString(raw).cache_key == disk_key[len(ExecutableCache.PARTS) :]
        svc.CompileError.FromString(raw)
        return disk_key.startswith(ExecutableCache.ERR)
    except DecodeError:
        return False
