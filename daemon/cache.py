"""Executable caches: a memory LRU bounded in bytes in front of a disk cache (diskcache)
bounded in bytes with LRU eviction. Every entry carries a sha256 checked on read; values
are protobuf bytes, never pickles (BytesDisk refuses anything else)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from google.protobuf.message import DecodeError
from trnsim.daemon.config import ensure_private_dir
from trnsim.daemon.remote import RemoteTier
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import disk_tier
from trnsim.protos.blobs import blob_ok

log = logging.getLogger(__name__)
T = TypeVar("T")
# A locked cache.db (a `trnsim cache` command, another daemon's long transaction) at start is
# waited for this long, then the daemon serves without its disk tier and tries again every
# DISK_RETRY_S: a locked, read-only or full cache costs the disk tier for a while, never the
# daemon (diskcache itself would retry a locked open for 60 s, then raise).
OPEN_WAIT_S = 5.0
DISK_RETRY_S = 30.0
# Rows whose times lie in the future (written by a clock ahead) are brought back to now this
# often: otherwise they are never the least recently used, and their expiry never comes.
CLAMP_EVERY_S = 60.0
# A value file no row refers to is deleted only once it is this old: diskcache writes a
# value's file before it commits its row, so a younger one may be a write in progress.
ORPHAN_AGE_S = 600.0
DAMAGED = "cache.db.damaged-"


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


class DiskTier(diskcache.Cache):  # type: ignore[misc]
    """diskcache.Cache that waits a bounded time (OPEN_WAIT_S) for a locked database while
    it opens, and whose volume counts all it occupies: the database, its value files, its
    write-ahead log (cache.db-wal, kept small) and a damaged database kept beside it."""

    extra_bytes = 0  # a damaged database kept for a post-mortem (ExecutableCache._asides)

    @property
    def _sql_retry(self) -> Callable[..., Any]:
        # (diskcache retries a statement on a locked database for 60 s while it opens)
        sql = self._sql

        def execute(statement: str, *args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + OPEN_WAIT_S
            while True:
                try:
                    return sql(statement, *args, **kwargs)
                except sqlite3.OperationalError as e:
                    if str(e) != "database is locked" or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)

        return execute

    def wal_bytes(self) -> int:
        return _file_size(Path(self.directory) / "cache.db-wal")

    def volume(self) -> int:
        return int(super().volume()) + self.wal_bytes() + self.extra_bytes


def wal_budget(disk_bytes: int) -> int:
    """The bytes the write-ahead log may take: a sixteenth of the disk limit (64 KiB to
    4 MiB). SQLite checkpoints it at that size and truncates it back to it (by default it
    grows to 4 MiB and stays there, beyond a small limit: 1 MiB took 5.1 MiB)."""
    return min(4 << 20, max(64 << 10, disk_bytes // 16))


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


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


class DiskTierOff(RuntimeError):
    """The disk tier could not be opened (read-only, full, locked): the message says why and
    what to do. Recoverable: the daemon serves from memory and tries the disk again."""


@dataclass(frozen=True)
class _Row:
    """One row of the disk tier as it is on disk, read without touching its access time."""

    rowid: int
    stored: float
    tag: str | None
    mode: int
    filename: str | None
    value: bytes | None


class ExecutableCache:
    """memory LRU -> disk. get() answers (blob, tier) or None; bad entries are dropped.

    A disk tier that cannot be opened (a read-only, full or locked cache.db) is off: the
    memory tier serves alone, `disk_off` says why (logged once, shown by `trnsim stats`),
    and it is tried again every `retry_s` until it opens (retry_s None: never, and the
    caller reports `disk_off` itself: the `trnsim cache` commands)."""

    # (protos/disk_tier.py: the layout ranks read hits in themselves)
    EXE = disk_tier.EXE
    ERR = disk_tier.ERR
    PARTS = disk_tier.PARTS  # a compiled key's parts (svc.KeyParts): what `Nearest` compares

    def __init__(
        self,
        directory: Path,
        memory_bytes: int,
        disk_bytes: int,
        tag: str = "",
        retry_s: float | None = DISK_RETRY_S,
    ) -> None:
        self.directory = directory
        self.tag = tag  # the compiler version: prune drops entries of other versions
        self.disk_bytes = disk_bytes
        self.memory = MemoryLRU(memory_bytes)
        self.disk_counters = TierCounters()
        self.corrupt = 0
        self.disk_errors = 0
        # key -> (expires at on the monotonic clock, CompileError bytes), oldest first, bounded
        self._errors: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()  # the memory tier and the error table
        self._disk_lock = threading.RLock()  # the disk tier: one operation at a time
        self.disk: DiskTier | None = None
        self.remote: RemoteTier | None = None  # the cluster tier (daemon/remote.py), if any
        self.disk_off = ""  # why the disk tier is off ("" while it is on)
        self._db_id: tuple[int, int] | None = None
        self._clamped_at = time.monotonic()
        self._closed = threading.Event()
        self._retry_s = retry_s
        if not self._turn_on() and retry_s is not None:
            retry = threading.Thread(target=self._retry, args=(retry_s,), daemon=True)
            retry.name = "disk-cache-retry"
            retry.start()

    # -- opening the disk tier --------------------------------------------------------------------
    def _turn_on(self) -> bool:
        """Opens the disk tier; False when it cannot (why: `disk_off`, logged when it changes).
        A directory that is not ours (ConfigError) still stops the caller: that is no fault
        of the disk but a refusal to use someone else's cache."""
        try:
            ensure_private_dir(self.directory)  # never through a symlink, never someone else's
            fresh = not (self.directory / "cache.db").exists()
            disk, replaced = self._open_intact()
        except (sqlite3.Error, OSError, diskcache.Timeout) as e:
            reason = self.why(e)
            if reason != self.disk_off and self._retry_s is not None:  # (else: the caller's)
                log.warning(
                    "disk cache %s is off: %s; compiles are kept in memory only, and the disk "
                    "is tried again every %g s (trnsim stats shows it)",
                    self.directory,
                    reason,
                    self._retry_s,
                )
            self.disk_off = reason
            return False
        with self._disk_lock:
            if self._closed.is_set():
                disk.close()
                return True
            self.disk, self._db_id, self.disk_off = disk, self._db_identity(), ""
        self._disk(clamp_future_times, 0)
        if fresh or replaced:  # value files a lost cache.db left
            self._disk(lambda d: remove_orphan_files(d, ORPHAN_AGE_S), 0)
        return True

    def why(self, error: BaseException) -> str:
        """why_off(error), knowing whether the cache's filesystem is read-only or full."""
        # (SQLite may say only "unable to open database file" on a read-only filesystem, and
        # "disk I/O error" on a full one: its shared-memory index cannot grow)
        try:
            full = shutil.disk_usage(self.directory).free < 64 * 1024
        except OSError:
            full = False
        read_only = not os.access(self.directory, os.W_OK)
        return why_off(error, read_only=read_only, full=full)

    def _retry(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            if self._turn_on():
                log.warning("disk cache %s is on again", self.directory)
                return

    def _open(self) -> DiskTier:
        # Small values live in the database itself (bytes on disk close to bytes counted);
        # every value, wherever it lives, carries its digest. A busy database (another
        # process: `trnsim cache ...`) is a miss after a second, not a stalled request.
        budget = wal_budget(self.disk_bytes)
        return DiskTier(
            str(self.directory),
            size_limit=self.disk_bytes,
            eviction_policy="least-recently-used",
            disk=BytesDisk,
            cull_limit=16,
            timeout=1.0,
            sqlite_wal_autocheckpoint=max(1, budget // 4096),  # (pages: SQLite's 4 KiB)
            sqlite_journal_size_limit=budget,
        )

    def _open_intact(self) -> tuple[DiskTier, bool]:
        """The disk tier, and whether a damaged cache.db had to be replaced: one that is not
        a database (garbled, truncated, overwritten) is moved aside, kept for a post-mortem,
        and an empty one takes its place. A cache loses entries, never the daemon."""
        try:
            disk, replaced = self._open(), False
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):
                raise  # (locked, read-only, full, no such directory: not the file's damage)
            self._move_aside(e)
            disk, replaced = self._open(), True
        disk.extra_bytes = self._asides()
        return disk, replaced

    def _move_aside(self, error: Exception) -> None:
        db = self.directory / "cache.db"
        aside = db.with_name(f"{DAMAGED}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        os.replace(db, aside)
        for suffix in ("-wal", "-shm"):  # (its journal belongs to it)
            journal = db.with_name(db.name + suffix)
            if journal.exists():
                os.replace(journal, aside.with_name(aside.name + suffix))
        log.warning("disk cache %s: cache.db is damaged (%s), moved to %s", db.parent, error, aside)

    def _asides(self) -> int:
        """Damaged databases moved aside: the newest is kept for a post-mortem when it takes
        at most a quarter of the disk limit (and counts against it), the others are deleted.
        Returns the bytes kept."""
        groups: dict[str, list[Path]] = {}  # (each with its -wal and -shm)
        for path in self.directory.glob(DAMAGED + "*"):
            base = path.name.removesuffix("-wal").removesuffix("-shm")
            groups.setdefault(base, []).append(path)
        sizes = {base: sum(_file_size(p) for p in paths) for base, paths in groups.items()}
        newest = max(groups, default="")  # (named by the time they were moved)
        keep = newest if sizes.get(newest, 0) <= self.disk_bytes // 4 else ""
        for base, paths in groups.items():
            if base == keep:
                continue
            for path in paths:
                path.unlink(missing_ok=True)
            log.warning("disk cache %s: deleted the damaged database %s", self.directory, base)
        return sizes.get(keep, 0)

    def _db_identity(self) -> tuple[int, int] | None:
        """The open database file as (device, inode); None when cache.db is not there."""
        try:
            st = os.stat(self.directory / "cache.db")
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _disk(self, call: Callable[[DiskTier], T], default: T) -> T:
        """A disk-tier operation, one at a time; whatever makes it fail (read-only, full,
        deleted or garbled database, a bug in diskcache) is logged and counted, `default`
        stands in, and the tier is reopened when its database is gone or in doubt. While the
        tier is off, `default` at once.

        A cache.db deleted or replaced under the daemon raises nothing (SQLite goes on
        writing to the unlinked file, lost at exit), so each operation first checks that the
        file at the path is still the one open (one stat) and reopens the tier if not."""
        with self._disk_lock:
            if self.disk is None:
                return default
            if self._db_identity() != self._db_id:
                log.warning("disk cache %s: cache.db was deleted or replaced", self.directory)
                self._reopen()
            try:
                return call(self.disk)
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
        assert self.disk is not None
        try:
            old, self.disk = self.disk, self._open_intact()[0]
            self._db_id = self._db_identity()
            old.close()
            log.warning("disk cache %s reopened", self.directory)
        except Exception as e:  # noqa: BLE001
            log.warning("disk cache %s cannot be reopened: %s", self.directory, e)

    def _maybe_clamp(self) -> None:
        """Every CLAMP_EVERY_S of writing: rows stamped by a clock ahead are brought to now."""
        if time.monotonic() - self._clamped_at < CLAMP_EVERY_S:
            return
        self._clamped_at = time.monotonic()
        self._disk(clamp_future_times, 0)

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
        return self.memory_has(key) or self._disk(lambda d: self.EXE + key in d, False)

    def memory_has(self, key: str) -> bool:
        with self._lock:
            return key in self.memory

    def get(self, key: str) -> tuple[svc.ExecutableBlob, svc.CacheTier] | None:
        """memory -> disk -> the remote tier, if there is one (a hit there fills disk and
        memory; one here is offered to the remote tier, once, for the other hosts)."""
        with self._lock:
            cached = self.memory.get(key)
        if cached is not None:
            self.memory.counters.hits += 1
            return cached, svc.MEMORY
        raw = self._disk_get(self.EXE + key)
        if raw is None:
            return self._remote_get(key)
        try:
            blob = svc.ExecutableBlob.FromString(raw)
        except Exception:  # noqa: BLE001  (a truncated or garbled entry)
            blob = svc.ExecutableBlob()
        if not blob_ok(blob, key):
            self._drop(key)
            return self._remote_get(key)
        self.disk_counters.hits += 1
        with self._lock:
            self.memory.put(key, blob, len(raw))
        if self.remote is not None:
            self.remote.put_later(key, blob, only_if_absent=True)
        return blob, svc.DISK

    def _remote_get(self, key: str) -> tuple[svc.ExecutableBlob, svc.CacheTier] | None:
        if self.remote is None:
            return None
        blob = self.remote.get(key)  # (checked: signature, version, digest)
        if blob is None:
            return None
        self._put_local(key, blob)
        return blob, svc.REMOTE

    def put(self, key: str, blob: svc.ExecutableBlob) -> None:
        """Stores a blob whose digest the caller has checked (a worker just made it). A disk
        that refuses it (read-only, full, gone, off) leaves it in memory only. The remote
        tier, if any, is written in the background."""
        self._put_local(key, blob)
        if self.remote is not None:
            self.remote.put_later(key, blob)

    def _put_local(self, key: str, blob: svc.ExecutableBlob) -> None:
        raw = blob.SerializeToString()
        with self._lock:
            self.memory.put(key, blob, len(raw))
        budget = wal_budget(self.disk_bytes)

        def store(disk: DiskTier) -> None:
            before = len(disk)
            disk.set(self.EXE + key, raw, tag=self.tag or None)
            self.disk_counters.evictions += max(0, before + 1 - len(disk))
            if disk.wal_bytes() > budget:  # (a reader held back the automatic checkpoint)
                disk._sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        self._disk(store, None)
        self._maybe_clamp()

    def touch(self, keys: list[str]) -> int:
        """Executables clients read from the disk tier themselves (protos/disk_tier.py): now
        their last use, as a hit here would have made it, so that eviction (least recently
        used) keeps them. One statement per disk_tier.BATCH keys; returns how many it held."""

        def mark(disk: DiskTier) -> int:
            touched, now = 0, time.time()
            for start in range(0, len(keys), disk_tier.BATCH):
                batch = [self.EXE + k for k in keys[start : start + disk_tier.BATCH]]
                touched += disk._sql(
                    "UPDATE Cache SET access_time = ?, access_count = access_count + 1 "
                    f"WHERE key IN ({','.join('?' * len(batch))}) AND raw = 1",
                    (now, *batch),
                ).rowcount
            return touched

        return self._disk(mark, 0)

    def _disk_get(self, disk_key: str) -> bytes | None:
        """A row's bytes; a row that cannot be read as ours (garbled, pickled) is dropped."""

        def read(disk: DiskTier) -> bytes | None:
            try:
                value = disk.get(disk_key, default=None)
            except (TypeError, ValueError) as e:  # (UnsafeEntry among them)
                log.warning("disk cache: dropping the unreadable entry %s (%s)", disk_key[:24], e)
                disk.delete(disk_key)
                self.corrupt += 1
                return None
            return value if isinstance(value, bytes) else None

        return self._disk(read, None)

    def _drop(self, key: str) -> None:
        """A corrupt entry: deleted everywhere and counted; the caller recompiles."""
        self.corrupt += 1
        with self._lock:
            self.memory.discard(key)
        self._disk(lambda d: d.delete(self.EXE + key), None)

    # -- deterministic compile errors, remembered for a while ------------------------------------
    def get_error(self, key: str) -> svc.CompileError | None:
        self._maybe_clamp()  # (an error stamped by a clock ahead is not served past its TTL)
        with self._lock:
            entry = self._errors.get(key)
        raw = entry[1] if entry is not None and entry[0] > time.monotonic() else None
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
            self._disk(lambda d: d.delete(self.ERR + key), None)
            return None

    def put_error(self, key: str, error: svc.CompileError, ttl_s: float) -> None:
        """Remembers a deterministic error for ttl_s: in memory on the monotonic clock, on
        disk on the wall clock (rows stamped ahead of it are brought back: _maybe_clamp)."""
        raw = error.SerializeToString()
        with self._lock:
            self._errors[key] = (time.monotonic() + ttl_s, raw)
            self._errors.move_to_end(key)
            while len(self._errors) > MAX_ERRORS_IN_MEMORY:
                self._errors.popitem(last=False)
        self._disk(lambda d: d.set(self.ERR + key, raw, expire=ttl_s, tag=self.tag or None), None)
        self._maybe_clamp()

    # -- the parts of compiled keys (explaining a miss) -------------------------------------------
    def put_parts(self, parts: svc.KeyParts) -> None:
        raw = parts.SerializeToString()
        self._disk(lambda d: d.set(self.PARTS + parts.cache_key, raw, tag=self.tag or None), None)

    def all_parts(self, limit: int) -> list[tuple[float, svc.KeyParts]]:
        """(stored at, parts) of the newest `limit` compiled keys, newest first: one query that
        reads the rows as they are (no access-time writes; a row that is not inline or not
        KeyParts is skipped: `trnsim cache verify` drops bad ones)."""

        def read(disk: DiskTier) -> list[tuple[float, svc.KeyParts]]:
            rows = disk._sql(
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

        return self._disk(read, [])

    # -- maintenance (trnsim cache ...), safe beside a daemon serving the same cache ---------------
    # Rows are read as they are (no access-time writes: the LRU order stays the daemon's), a
    # row is deleted only when proven bad by our own digest, and only if it is still the row
    # that was read; value files no row refers to go only once ORPHAN_AGE_S old (diskcache's
    # check(fix=True) deleted the files of writes not yet committed: 3 of 240 entries lost).
    def tier(self) -> DiskTier:
        """The disk tier, for maintenance; DiskTierOff when it could not be opened."""
        if self.disk is None:
            raise DiskTierOff(self.disk_off)
        return self.disk

    def keys(self) -> list[str]:
        """Every key on disk. Rows whose key is not a plain string (pickled: planted or
        foreign) are deleted, never loaded."""
        disk = self.tier()
        rows = disk._sql("SELECT rowid, key, raw FROM Cache").fetchall()
        keys = []
        for rowid, key, raw in rows:
            if raw and isinstance(key, str):
                keys.append(key)
            else:
                log.warning("disk cache: deleting a row with a pickled key (rowid %d)", rowid)
                disk._sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                self.corrupt += 1
        return keys

    def entries(self) -> Iterator[tuple[str, int, str]]:
        """(key, bytes, compiler version) of every executable on disk."""
        disk = self.tier()
        for disk_key in self.keys():
            if not disk_key.startswith(self.EXE):
                continue
            row = _find_row(disk, disk_key)
            value = _row_value(disk, row) if row is not None else None
            if row is not None and value is not None:  # (else: verify drops it)
                yield disk_key[len(self.EXE) :], len(value), row.tag or ""

    def verify(self) -> tuple[int, int]:
        """Checks every disk entry: an executable's digest against its own key (a swapped
        entry fails), an error's and key parts' encoding; deletes bad ones. Returns (good,
        bad)."""
        disk = self.tier()
        good = bad = 0
        for disk_key in self.keys():
            row = _find_row(disk, disk_key)
            if row is None:
                continue  # (evicted or replaced meanwhile by a daemon)
            value = _row_value(disk, row)
            if value is not None and _entry_ok(disk_key, value):
                good += 1
            elif _delete_row(disk, row):
                bad += 1
                with self._lock:
                    self.memory.discard(disk_key.removeprefix(self.EXE))
        self.corrupt += bad
        remove_orphan_files(disk, ORPHAN_AGE_S)
        return good, bad

    def prune(self) -> int:
        """Drops expired errors (times stamped by a clock ahead brought back to now first),
        entries of other compiler versions and old value files no row refers to; returns
        how many entries went."""
        disk = self.tier()
        clamp_future_times(disk)
        removed = int(disk.expire())
        for disk_key in self.keys() if self.tag else []:
            row = _find_row(disk, disk_key)
            if row is not None and row.tag != self.tag and _delete_row(disk, row):
                removed += 1
        disk.cull()
        remove_orphan_files(disk, ORPHAN_AGE_S)
        return removed

    def clear(self) -> int:
        with self._lock:
            self.memory.clear()
            self._errors.clear()
        return int(self.tier().clear())

    def disk_stats(self) -> tuple[int, int]:
        """(executables and remembered errors on disk, bytes the disk tier uses: database,
        value files, write-ahead log and a damaged database kept)."""

        def read(disk: DiskTier) -> tuple[int, int]:
            parts = disk._sql(
                "SELECT COUNT(*) FROM Cache WHERE key >= ? AND key < ?",
                (self.PARTS, self.PARTS[:-1] + chr(ord(":") + 1)),
            ).fetchone()[0]
            return len(disk) - int(parts), disk.volume()

        return self._disk(read, (0, 0))

    def close(self) -> None:
        self._closed.set()
        if self.remote is not None:
            self.remote.flush(timeout_s=2.0)  # (what the workers made reaches the cluster)
            self.remote.close()
        with self._disk_lock:
            if self.disk is not None:
                self.disk.close()


def why_off(error: BaseException, read_only: bool = False, full: bool = False) -> str:
    """What stops the disk tier from opening or writing, and what to do, in one line."""
    text = str(error)
    errno_ = getattr(error, "errno", None)
    if read_only or "readonly" in text or errno_ in (errno.EROFS, errno.EACCES):
        what = "the cache cannot be written (read-only)"
        do = "make the cache directory writable, or point --cache-dir elsewhere"
    elif full or "full" in text or errno_ in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        what = "the disk is full"
        do = "free space there, or lower --disk-cache-mb, or point --cache-dir elsewhere"
    elif "locked" in text or isinstance(error, diskcache.Timeout):
        what = f"cache.db is locked by another process for over {OPEN_WAIT_S:.0f} s"
        do = "a `trnsim cache` command or another daemon holds it; wait for it to finish"
    else:
        what = "it cannot be opened"
        do = "run `trnsim cache verify`, or point --cache-dir elsewhere"
    return f"{what} ({type(error).__name__}: {text}); {do}"


def clamp_future_times(disk: DiskTier) -> int:
    """Rows stamped in the future (by a clock that was ahead, or has since been set back)
    brought back to now: their access time (else they are never the least recently used, so
    never evicted) and their store time with their expiry, keeping the TTL they were given
    (else a cached error outlives it by however far the clock was ahead). One indexed and
    one full scan of the table. Returns how many rows changed."""
    now = time.time()
    with disk.transact():
        stored = disk._sql(
            "UPDATE Cache SET expire_time = ? + (expire_time - store_time), store_time = ? "
            "WHERE store_time > ?",
            (now, now, now),
        ).rowcount
        accessed = disk._sql(
            "UPDATE Cache SET access_time = ? WHERE access_time > ?", (now, now)
        ).rowcount
    if stored or accessed:
        log.warning(
            "disk cache %s: %d rows were stamped in the future (a clock ahead): set to now",
            disk.directory,
            max(stored, accessed),
        )
    return int(stored) + int(accessed)


def remove_orphan_files(disk: DiskTier, min_age_s: float) -> int:
    """Deletes value files no row refers to once they are min_age_s old (a younger one may
    be a write whose row is not committed yet); returns how many went."""
    referenced = {
        name for (name,) in disk._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL")
    }
    root = Path(disk.directory)
    removed = 0
    for path in root.glob("*/*/*.val"):  # (diskcache's two levels of subdirectories)
        name = str(path.relative_to(root))
        try:
            old = time.time() - path.stat().st_mtime >= min_age_s
        except OSError:
            continue
        if name not in referenced and old:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _find_row(disk: DiskTier, disk_key: str) -> _Row | None:
    row = disk._sql(
        "SELECT rowid, store_time, tag, mode, filename, value FROM Cache WHERE key = ? AND raw = 1",
        (disk_key,),
    ).fetchone()
    return _Row(*row) if row is not None else None


def _row_value(disk: DiskTier, row: _Row) -> bytes | None:
    """A row's bytes, read without touching its access time; None when they cannot be read
    as ours (pickled, text, a value file gone)."""
    try:
        value = disk._disk.fetch(row.mode, row.filename, row.value, False)
    except (TypeError, ValueError, OSError):  # (UnsafeEntry among them)
        return None
    return value if isinstance(value, bytes) else None


def _delete_row(disk: DiskTier, row: _Row) -> bool:
    """Deletes a row if it is still the one read (a daemon may have rewritten it since),
    with its value file; whether it did."""
    deleted = disk._sql(
        "DELETE FROM Cache WHERE rowid = ? AND store_time = ?", (row.rowid, row.stored)
    ).rowcount
    if deleted and row.filename:
        disk._disk.remove(row.filename)
    return bool(deleted)


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
