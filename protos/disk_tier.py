"""The compile daemon's disk tier as it lies on disk, and a read-only reader of its executables.

The daemon (daemon/cache.py) is the tier's only writer: diskcache's `Cache` table in
cache.db, one row per entry, keyed "exe:<cache key>" for an executable (ExecutableBlob bytes
in the row, or in a value file beside it once they are large), "err:" for a remembered
compile error and "parts:" for a compiled key's parts. Training processes read executables
here themselves (`DiskReader`), so a cache hit costs them a query, not a round trip."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import blob_ok

EXE, ERR, PARTS = "exe:", "err:", "parts:"
DATABASE = "cache.db"
# diskcache's modes of a bytes value: in the row (raw) or in a value file (binary). Any other
# mode is text or a pickle: never written by the daemon, never read.
MODE_RAW, MODE_BINARY = 1, 2
BATCH = 500  # keys per query (SQLite allows 32766 parameters to a statement; older ones 999)
# How long a read waits for a database the daemon holds busy (a checkpoint that truncates the
# write-ahead log, a `trnsim cache` command's VACUUM) before it gives up: asking the daemon
# costs less than waiting.
BUSY_WAIT_S = 0.05


@dataclass
class Reads:
    """What one read of many keys found: executables whose digest binds them to their key,
    and keys whose row is there but refused (damaged, another key's bytes, not ours). A key
    in neither is a miss (not cached, or evicted or replaced while it was being read)."""

    found: dict[str, svc.ExecutableBlob] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)


class DiskReader:
    """A read-only connection to a disk tier: it never writes (not even an access time; the
    daemon's LRU order hears of these hits through the Touch RPC), never holds a transaction
    past one query, and hands out only blobs whose digest it checked against the key asked.

    SQLite's snapshot isolation means a row is seen whole or not at all, and diskcache writes
    a value file before it commits the row naming it (and never rewrites one in place), so a
    half-written entry cannot be seen; a damaged or swapped one fails its digest."""

    def __init__(self, directory: Path) -> None:
        """Opens `directory`/cache.db read-only; sqlite3.Error or OSError if it cannot be."""
        self.directory = directory
        database = directory / DATABASE
        self.identity = _identity(database)  # the file opened, to notice one put in its place
        uri = f"file:{urllib.parse.quote(str(database))}?mode=ro"
        self._db = sqlite3.connect(
            uri, timeout=BUSY_WAIT_S, uri=True, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()  # (one connection: one statement at a time)
        try:
            self._db.execute("PRAGMA query_only = 1")
            self._db.execute("SELECT 1 FROM Cache LIMIT 1").fetchall()  # (a cache, readable)
        except sqlite3.Error:
            self._db.close()
            raise

    def read(self, keys: list[str]) -> Reads:
        """The executables of `keys` the tier holds, in one query per BATCH keys."""
        reads = Reads()
        for start in range(0, len(keys), BATCH):
            for row in self._rows(keys[start : start + BATCH]):
                self._take(reads, *row)
        return reads

    def replaced(self) -> bool:
        """Whether cache.db is no longer the file this reader opened (deleted, or a damaged
        one moved aside by the daemon and a new one made): reopen to see new entries."""
        return _identity(self.directory / DATABASE) != self.identity

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, keys: list[str]) -> list[tuple[str, int, str | None, object]]:
        marks = ",".join("?" * len(keys))
        with self._lock:
            return self._db.execute(
                f"SELECT key, mode, filename, value FROM Cache WHERE key IN ({marks}) "
                "AND raw = 1 AND (expire_time IS NULL OR expire_time > ?)",
                [EXE + k for k in keys] + [time.time()],
            ).fetchall()

    def _take(
        self, reads: Reads, disk_key: str, mode: int, filename: str | None, value: object
    ) -> None:
        key = disk_key[len(EXE) :]
        try:
            raw = self._value(mode, filename, value)
        except FileNotFoundError:
            return  # (evicted or replaced since the query: a miss)
        except (OSError, ValueError):
            raw = None
        blob = _blob(raw) if raw is not None else None
        if blob is not None and blob_ok(blob, key):
            reads.found[key] = blob
        else:
            reads.bad.append(key)

    def _value(self, mode: int, filename: str | None, value: object) -> bytes | None:
        """A row's bytes as the daemon stored them; None for a row it never writes."""
        if mode == MODE_RAW:
            return value if isinstance(value, bytes) else None
        if mode != MODE_BINARY or not _value_file(filename):
            return None
        assert filename is not None
        with open(self.directory / filename, "rb") as f:
            return f.read()


def _blob(raw: bytes) -> svc.ExecutableBlob | None:
    try:
        return svc.ExecutableBlob.FromString(raw)
    except DecodeError:
        return None


def _value_file(filename: str | None) -> bool:
    """A name diskcache gives a value file ("ab/cd/<hex>.val", under the tier's directory):
    a row naming anything else (an absolute path, "..") is not read."""
    if not filename or filename.startswith(("/", "\\")):
        return False
    parts = filename.split("/")
    return len(parts) == 3 and ".." not in parts and parts[-1].endswith(".val")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
