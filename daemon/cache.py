"""Executable caches: a memory LRU bounded in bytes in front of a disk cache (diskcache)
bounded in bytes with LRU eviction. Every entry carries a sha256 checked on read; values
are protobuf bytes, never pickles (BytesDisk refuses anything else)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
from trnsim.protos import compile_service_pb2 as svc


class BytesDisk(diskcache.Disk):  # type: ignore[misc]
    """diskcache storage that holds str keys and bytes values only: nothing is pickled."""

    def put(self, key: Any) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"cache keys are str, not {type(key).__name__}")
        return super().put(key)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not isinstance(value, bytes):
            raise TypeError(f"cache values are bytes, not {type(value).__name__}")
        return super().store(value, read, key=key)


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def make_blob(data: bytes, format_version: int) -> svc.ExecutableBlob:
    return svc.ExecutableBlob(data=data, sha256=digest(data), format_version=format_version)


def blob_ok(blob: svc.ExecutableBlob) -> bool:
    return len(blob.sha256) == 32 and digest(blob.data) == blob.sha256


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

    def __init__(self, directory: Path, memory_bytes: int, disk_bytes: int, tag: str = "") -> None:
        self.directory = directory
        self.tag = tag  # the compiler version: prune drops entries of other versions
        self.memory = MemoryLRU(memory_bytes)
        self.disk = diskcache.Cache(
            str(directory),
            size_limit=disk_bytes,
            eviction_policy="least-recently-used",
            disk=BytesDisk,
            disk_min_file_size=0,  # every value in its own file: integrity checked per entry
            cull_limit=16,
        )
        self.disk_counters = TierCounters()
        self.corrupt = 0
        self._errors: dict[str, tuple[float, bytes]] = {}  # key -> (expires at, CompileError)
        self._lock = threading.Lock()

    # -- executables ----------------------------------------------------------------------------
    def memory_get(self, key: str) -> svc.ExecutableBlob | None:
        """The memory tier alone (never blocks on disk): for answering on the event loop."""
        with self._lock:
            blob = self.memory.get(key)
        if blob is not None:
            self.memory.counters.hits += 1
        return blob

    def in_memory(self, key: str) -> bool:
        return key in self.memory

    def get(self, key: str) -> tuple[svc.ExecutableBlob, int] | None:
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
        if not blob_ok(blob):
            self._drop(key)
            return None
        self.disk_counters.hits += 1
        with self._lock:
            self.memory.put(key, blob, len(raw))
        return blob, svc.DISK

    def put(self, key: str, blob: svc.ExecutableBlob) -> None:
        """Stores a blob whose digest the caller has checked (a worker just made it)."""
        raw = blob.SerializeToString()
        with self._lock:
            self.memory.put(key, blob, len(raw))
        before = len(self.disk)
        self.disk.set(self.EXE + key, raw, tag=self.tag or None)
        self.disk_counters.evictions += max(0, before + 1 - len(self.disk))

    def _disk_get(self, disk_key: str) -> bytes | None:
        try:
            value = self.disk.get(disk_key, default=None)
        except (OSError, TypeError, ValueError):
            self.disk.delete(disk_key)
            self.corrupt += 1
            return None
        return value if isinstance(value, bytes) else None

    def _drop(self, key: str) -> None:
        """A corrupt entry: deleted everywhere and counted; the caller recompiles."""
        self.corrupt += 1
        with self._lock:
            self.memory.discard(key)
        self.disk.delete(self.EXE + key)

    # -- deterministic compile errors, remembered for a while ------------------------------------
    def get_error(self, key: str) -> svc.CompileError | None:
        now = time.time()
        entry = self._errors.get(key)
        if entry is not None and entry[0] > now:
            return svc.CompileError.FromString(entry[1])
        raw = self._disk_get(self.ERR + key)
        if raw is None:
            return None
        return svc.CompileError.FromString(raw)

    def put_error(self, key: str, error: svc.CompileError, ttl_s: float) -> None:
        raw = error.SerializeToString()
        self._errors[key] = (time.time() + ttl_s, raw)
        self.disk.set(self.ERR + key, raw, expire=ttl_s, tag=self.tag or None)

    # -- maintenance (trnsim cache ...) ------------------------------------------------------------
    def entries(self) -> Iterator[tuple[str, int, str]]:
        """(key, bytes, compiler version) of every executable on disk."""
        for disk_key in self.disk.iterkeys():
            if not disk_key.startswith(self.EXE):
                continue
            value, tag = self.disk.get(disk_key, default=None, tag=True)
            if value is not None:
                yield disk_key[len(self.EXE) :], len(value), tag or ""

    def verify(self) -> tuple[int, int]:
        """Checks every disk entry's digest; deletes bad ones. Returns (good, bad)."""
        good = bad = 0
        for disk_key in list(self.disk.iterkeys()):
            raw = self._disk_get(disk_key)
            if raw is None:
                continue
            if disk_key.startswith(self.ERR):
                good += 1
                continue
            try:
                ok = blob_ok(svc.ExecutableBlob.FromString(raw))
            except Exception:  # noqa: BLE001
                ok = False
            if ok:
                good += 1
            else:
                bad += 1
                self._drop(disk_key[len(self.EXE) :])
        return good, bad

    def prune(self) -> int:
        """Drops expired errors and entries of other compiler versions; returns how many."""
        removed = self.disk.expire()
        for disk_key in list(self.disk.iterkeys()):
            _, tag = self.disk.get(disk_key, default=None, tag=True)
            if self.tag and tag != self.tag:
                self.disk.delete(disk_key)
                removed += 1
        self.disk.cull()
        return int(removed)

    def clear(self) -> int:
        with self._lock:
            self.memory.clear()
        self._errors.clear()
        return int(self.disk.clear())

    def disk_stats(self) -> tuple[int, int]:
        return len(self.disk), int(self.disk.volume())

    def close(self) -> None:
        self.disk.close()
