"""Cache hits read straight from the host daemon's disk tier (protos/disk_tier.py), read-only:
a hit costs this process one query, not a round trip to the daemon; misses, joins and every
entry in doubt still go to the daemon (NEURON_COMPILE_DIRECT_READS=0 sends them all)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from trnsim import compiler
from trnsim.protos import executable_pb2
from trnsim.protos.blobs import checked_executable
from trnsim.protos.disk_tier import DiskReader

log = logging.getLogger(__name__)
# A disk tier that could not be opened (none yet, another user's, a broken cache.db) is
# tried again this long after; meanwhile every lookup goes to the daemon.
REOPEN_AFTER_S = 5.0


class DirectReads:
    """One process's reader of its daemon's disk tier. It hands out only executables whose
    digest binds them to the key asked and that this compiler, in this format, built; an
    entry it refuses is a miss, warned about once: the daemon, asked next, meets the same
    entry, drops it and counts it (`trnsim stats`: corrupt entries dropped)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.version = compiler.compiler_version()
        self.refused = 0  # entries met and not used (damaged, another key's, not ours)
        self._reader: DiskReader | None = None
        self._pid = os.getpid()  # (a connection is never used in a forked child)
        self._retry_at = 0.0
        self._touched: dict[str, None] = {}  # (in order, each key once)
        self._lock = threading.Lock()

    def executables(self, keys: list[str]) -> dict[str, executable_pb2.Executable]:
        """The executables of `keys` the disk tier holds, read in one go; the rest are misses."""
        reader = self._open()
        if reader is None:
            return {}
        try:
            reads = reader.read(keys)
        except sqlite3.OperationalError as e:  # (busy a moment, or gone: ask the daemon)
            log.debug("direct read of %s: %s", self.directory, e)
            if not _busy(e):
                self._drop(reader)
            return {}
        except sqlite3.Error as e:  # (a database damaged under us: ask the daemon)
            log.debug("direct read of %s: %s", self.directory, e)
            self._drop(reader)
            return {}
        found = {}
        for key, blob in reads.found.items():  # (each digest checked by the reader)
            exe = checked_executable(blob, key, self.version, compiler.FORMAT_VERSION)
            if exe is None:
                reads.bad.append(key)
            else:
                found[key] = exe
        self._count(found, reads.bad)
        if len(found) < len(keys) and reader.replaced():
            self._drop(reader)  # (a new cache.db: the next read opens it)
        return found

    def touched(self) -> list[str]:
        """The keys read since the last call: for the daemon's LRU order (the Touch RPC)."""
        with self._lock:
            keys, self._touched = list(self._touched), {}
        return keys

    def close(self) -> None:
        with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def _open(self) -> DiskReader | None:
        reader = self._reader
        if reader is not None and self._pid == os.getpid():  # (the hot path: no lock)
            return reader
        with self._lock:
            if self._pid != os.getpid():  # (a forked child: its parent's connection is left be)
                self._pid, self._reader, self._retry_at = os.getpid(), None, 0.0
            if self._reader is not None or time.monotonic() < self._retry_at:
                return self._reader
            try:
                self._reader = DiskReader(self.directory)
            except (sqlite3.Error, OSError) as e:
                log.debug("no direct reads of %s for now: %s", self.directory, e)
                self._retry_at = time.monotonic() + REOPEN_AFTER_S
            return self._reader

    def _drop(self, reader: DiskReader) -> None:
        with self._lock:
            if self._reader is reader:
                self._reader = None
        reader.close()

    def _count(self, found: dict[str, executable_pb2.Executable], bad: list[str]) -> None:
        with self._lock:
            self._touched.update(dict.fromkeys(found))
            first = not self.refused
            self.refused += len(bad)
        if bad:
            (log.warning if first else log.debug)(
                "the compile cache in %s holds %d damaged or wrong entries (%s...): not used; "
                "the daemon, asked instead, drops them (`trnsim cache verify` checks them all)",
                self.directory,
                len(bad),
                bad[0][:16],
            )


def _busy(error: sqlite3.OperationalError) -> bool:
    return "locked" in str(error) or "busy" in str(error)
