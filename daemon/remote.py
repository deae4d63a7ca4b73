"""The cluster tier: executables shared by every host's daemon through a remote store, behind
each daemon's memory and disk tiers (daemon/cache.py). Lookups go memory -> disk -> remote ->
compile; a remote hit fills disk and memory; a finished compile, and an executable a daemon
finds on its own disk, are written to the store in the background, never delaying anyone.

The store is shared, so nothing read from it is trusted:
- an entry is signed (HMAC-SHA256) with the cluster key, a secret file only the daemon's user
  can read (NEURON_CACHE_REMOTE_KEY_FILE); an entry whose signature fails is never served, and
  is counted;
- the signed bytes carry the compiler version and an ExecutableBlob, whose digest binds the
  executable to its cache key (protos/blobs.py), as on disk;
- an entry is read with a size bound: a larger one is never read whole.

The store is also remote, so it may be slow or gone. Every call has a deadline. A call that
fails or times out turns the tier off: lookups and writes skip it (a miss, a write dropped,
both counted) while a background thread asks the store again every RETRY_S, and the tier
comes back on when it answers. So a dead or paused store costs a request at most one
deadline, once; it is said once in the log and in `trnsim stats`; a compile never fails
because of it.

RemoteStore is what a store provides (get with a bound, put, stat, ping): RedisStore is the one
today; an S3-compatible object store would be another (docs/operations.md says which to pick).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import queue
import stat as stat_mode
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from trnsim.daemon.config import ConfigError
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos.blobs import blob_ok

log = logging.getLogger(__name__)

PREFIX = "trnsim:exe:"  # the store's key of a cache key's entry
RETRY_S = 5.0  # how often a tier turned off asks its store again
QUEUE = 1024  # writes waiting for the store; more are dropped (counted)
RECENT_S = 300.0  # errors shown by `trnsim stats`: those of the last five minutes
RECENT = 20  # and at most this many of them
MIN_KEY_BYTES = 16


class StoreError(RuntimeError):
    """A store call that failed (refused, timed out, an error from the store)."""


@dataclass(frozen=True)
class StoreStat:
    """What a store says of itself (-1: it does not say)."""

    entries: int = -1
    used_bytes: int = -1
    max_bytes: int = -1
    policy: str = ""


class RemoteStore(Protocol):
    """A shared key-value store of entries (bytes), every call bounded by the store's
    deadline; a failure raises StoreError."""

    name: str  # where it is, without credentials (logs, `trnsim stats`)

    def get(self, key: str, limit: int) -> bytes | None:
        """The entry of key (at most limit + 1 of its bytes), or None if it has none."""

    def put(self, key: str, data: bytes, only_if_absent: bool) -> None: ...

    def stat(self) -> StoreStat: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


class RedisStore:
    """A Redis server (`redis://HOST:PORT/DB`, `rediss://...`, `unix:///path.sock?db=N`): a
    connection pool whose every socket operation has the deadline, and no retries (a retry
    would multiply the deadline)."""

    def __init__(self, url: str, deadline_s: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.name = _without_password(url)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        try:
            self._redis = redis.Redis.from_url(
                url,
                socket_timeout=deadline_s,
                socket_connect_timeout=deadline_s,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
            )
        except ValueError as e:
            raise ConfigError(
                f"remote cache {self.name!r}: {e} (use redis://HOST:PORT/DB or "
                f"unix:///path/to/redis.sock?db=0)"
            ) from None

    def _call(self, what: Callable[[], Any]) -> Any:
        try:
            return what()
        except self._errors as e:
            raise StoreError(f"{type(e).__name__}: {e}") from e

    def get(self, key: str, limit: int) -> bytes | None:
        data = self._call(lambda: self._redis.getrange(key, 0, limit))
        return bytes(data) if data else None  # (a missing key reads as b"")

    def put(self, key: str, data: bytes, only_if_absent: bool) -> None:
        self._call(lambda: self._redis.set(key, data, nx=only_if_absent))

    def stat(self) -> StoreStat:
        def read() -> StoreStat:
            memory: dict[str, Any] = self._redis.info("memory")  # type: ignore[assignment]
            entries: int = self._redis.dbsize()  # type: ignore[assignment]
            return StoreStat(
                entries=int(entries),
                used_bytes=int(memory.get("used_memory", -1)),
                max_bytes=int(memory.get("maxmemory", -1)),
                policy=str(memory.get("maxmemory_policy", "")),
            )

        return self._call(read)  # type: ignore[no-any-return]

    def ping(self) -> None:
        self._call(self._redis.ping)

    def close(self) -> None:
        self._redis.close()


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def open_store(url: str, deadline_s: float) -> RemoteStore:
    """The store a URL names (NEURON_CACHE_REMOTE, `--remote`)."""
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix"):
        return RedisStore(url, deadline_s)
    raise ConfigError(
        f"remote cache {url!r}: unknown scheme {scheme!r}; use redis://HOST:PORT/DB or "
        f"unix:///path/to/redis.sock?db=0"
    )


def read_cluster_key(path: Path) -> bytes:
    """The cluster key: a file of this user's that no one else can read, of at least 16
    bytes. Anything else is refused with how to make one."""
    make = f"umask 077; head -c 32 /dev/urandom > {path}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(
            f"cluster key {path}: {e.strerror}; make one (the same file on every host: "
            f"`{make}`) and name it with NEURON_CACHE_REMOTE_KEY_FILE or --remote-key-file"
        ) from None
    if not stat_mode.S_ISREG(st.st_mode):
        raise ConfigError(f"cluster key {path} is not a regular file")
    if st.st_uid != os.getuid():
        raise ConfigError(f"cluster key {path} belongs to uid {st.st_uid}, not to the daemon's")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"cluster key {path} can be read by other users (mode {st.st_mode & 0o777:o}): "
            f"anyone who reads it can sign executables every host will run; "
            f"run `chmod 600 {path}`"
        )
    key = path.read_bytes()
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"cluster key {path} has {len(key)} bytes, fewer than 16: `{make}`")
    return key


def _signature(secret: bytes, key: str, version: str, blob: bytes) -> bytes:
    mac = hmac.new(secret, key.encode("ascii", "replace"), hashlib.sha256)
    mac.update(b"\n" + version.encode("utf-8", "replace") + b"\n")
    mac.update(blob)
    return mac.digest()


def seal(secret: bytes, key: str, version: str, blob: svc.ExecutableBlob) -> bytes:
    """The store's entry of an executable: signed, carrying the compiler version."""
    data = blob.SerializeToString()
    return svc.RemoteEntry(
        blob=data, compiler_version=version, signature=_signature(secret, key, version, data)
    ).SerializeToString()


class Verdict:
    """Why an entry read from the store was not served (opened() names it)."""

    FORGED = "signature"  # not signed with the cluster key (or changed since)
    VERSION = "version"  # signed, by another compiler version
    DAMAGED = "damaged"  # signed, but not this key's executable (or not one at all)


def opened(secret: bytes, key: str, version: str, raw: bytes) -> svc.ExecutableBlob | str:
    """The executable an entry carries, or the Verdict on it."""
    try:
        entry = svc.RemoteEntry.FromString(raw)
    except Exception:  # noqa: BLE001  (not even an entry: nobody with the key wrote it)
        return Verdict.FORGED
    expected = _signature(secret, key, entry.compiler_version, entry.blob)
    if not hmac.compare_digest(expected, entry.signature):
        return Verdict.FORGED
    if entry.compiler_version != version:
        return Verdict.VERSION
    try:
        blob = svc.ExecutableBlob.FromString(entry.blob)
    except Exception:  # noqa: BLE001
        return Verdict.DAMAGED
    return blob if blob_ok(blob, key) else Verdict.DAMAGED


class _Reading:
    """A read of one key in progress, and its result once done."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.blob: svc.ExecutableBlob | None = None


class RemoteTier:
    """One daemon's use of a remote store: signed entries, a deadline per call, off (and
    retried in the background) after a failure, writes from a background thread."""

    def __init__(
        self,
        store: RemoteStore,
        secret: bytes,
        version: str,
        max_entry_bytes: int,
        retry_s: float = RETRY_S,
        latency: Any = None,
    ) -> None:
        self.store = store
        self.secret = secret
        self.version = version
        self.max_entry_bytes = max_entry_bytes
        self.retry_s = retry_s
        self.latency = latency  # a Histogram of the store's calls (seconds), when given
        self.lock = threading.Lock()
        self.hits = self.misses = self.puts = self.put_errors = self.puts_dropped = 0
        self.skipped = 0  # lookups not asked while the tier was off
        self.forged = 0  # entries whose signature failed: never served
        self.refused = 0  # signed entries not served (another version, damaged, too large)
        self.errors = 0
        self.recent: collections.deque[tuple[float, str]] = collections.deque(maxlen=RECENT)
        self.down = ""  # why the tier is off ("": on)
        self._known: set[str] = set()  # keys this daemon wrote or read there
        self._reading: dict[str, _Reading] = {}  # keys being read now
        self.joined = 0  # lookups that waited for another's read of the same key
        self._writes: queue.Queue[tuple[str, svc.ExecutableBlob, bool] | None] = queue.Queue(QUEUE)
        self._closed = threading.Event()
        self._retrying = False
        self._writer = threading.Thread(target=self._write_loop, name="remote-writes", daemon=True)
        self._writer.start()

    # -- lookups ---------------------------------------------------------------------------------
    def get(self, key: str) -> svc.ExecutableBlob | None:
        """The executable the store holds for key, checked; None on a miss, an entry refused,
        or a store that is off or fails (at most one deadline). Lookups of a key already being
        read (two ranks asking at once) wait for that read rather than making their own."""
        if self.down:
            with self.lock:
                self.skipped += 1
            return None
        with self.lock:
            reading = self._reading.get(key)
            joining = reading is not None
            if reading is None:
                reading = self._reading[key] = _Reading()
            else:
                self.joined += 1
        if joining:
            reading.done.wait()  # (bounded: the read it waits for has the store's deadline)
            return reading.blob
        try:
            reading.blob = self._read(key)
        finally:
            with self.lock:
                del self._reading[key]
            reading.done.set()
        return reading.blob

    def _read(self, key: str) -> svc.ExecutableBlob | None:
        began = time.monotonic()
        try:
            raw = self.store.get(PREFIX + key, self.max_entry_bytes)
        except StoreError as e:
            self._failed("get", e)
            return None
        self._timed(began)
        if raw is None:
            with self.lock:
                self.misses += 1
            return None
        if len(raw) > self.max_entry_bytes:
            self._refuse(key, f"larger than {self.max_entry_bytes} bytes")
            return None
        verdict = opened(self.secret, key, self.version, raw)
        if isinstance(verdict, str):
            if verdict == Verdict.FORGED:
                with self.lock:
                    self.forged += 1
                self._note(f"an entry failed its signature check (key {key[:16]}): not served")
                log.warning("remote cache: the entry of %s failed its signature check", key[:16])
                return None
            self._refuse(key, verdict)
            return None
        with self.lock:
            self.hits += 1
            self._known.add(key)
        return verdict

    def _refuse(self, key: str, why: str) -> None:
        with self.lock:
            self.refused += 1
        log.debug("remote cache: entry of %s not served (%s)", key[:16], why)

    # -- writes ----------------------------------------------------------------------------------
    def put_later(self, key: str, blob: svc.ExecutableBlob, only_if_absent: bool = False) -> None:
        """Writes the executable to the store from the background (a compile just made it:
        only_if_absent False; found on this host's disk: True). Never blocks."""
        if self.down or self._closed.is_set():
            with self.lock:
                self.puts_dropped += 1
            return
        with self.lock:
            if key in self._known:
                return
            self._known.add(key)
        try:
            self._writes.put_nowait((key, blob, only_if_absent))
        except queue.Full:
            with self.lock:
                self.puts_dropped += 1
                self._known.discard(key)

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            try:
                self._write(*item)
            finally:
                self._writes.task_done()

    def _write(self, key: str, blob: svc.ExecutableBlob, only_if_absent: bool) -> None:
        if self.down:
            with self.lock:
                self.puts_dropped += 1
                self._known.discard(key)
            return
        entry = seal(self.secret, key, self.version, blob)
        if len(entry) > self.max_entry_bytes:
            with self.lock:
                self.puts_dropped += 1
            return
        began = time.monotonic()
        try:
            self.store.put(PREFIX + key, entry, only_if_absent)
        except StoreError as e:
            with self.lock:
                self.put_errors += 1
                self._known.discard(key)
            self._failed("put", e, turn_off=not _refused_write(e))
            return
        self._timed(began)
        with self.lock:
            self.puts += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits until the writes queued so far are done (tests, a daemon draining)."""
        deadline = time.monotonic() + timeout_s
        while self._writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._writes.unfinished_tasks

    # -- failures --------------------------------------------------------------------------------
    def _failed(self, what: str, error: StoreError, turn_off: bool = True) -> None:
        self._note(f"{what}: {error}")
        with self.lock:
            self.errors += 1
            if not turn_off or self.down or self._closed.is_set():
                return
            self.down = f"{what} failed: {error}"
            start = not self._retrying
            self._retrying = True
        log.warning(
            "remote cache %s: %s failed (%s); serving from this host's tiers and compiling, "
            "asking it again every %.0f s",
            self.store.name,
            what,
            error,
            self.retry_s,
        )
        if start:
            threading.Thread(target=self._retry, name="remote-retry", daemon=True).start()

    def _retry(self) -> None:
        while not self._closed.wait(self.retry_s):
            try:
                self.store.ping()
            except StoreError as e:
                log.debug("remote cache %s still unreachable: %s", self.store.name, e)
                continue
            with self.lock:
                self.down = ""
                self._retrying = False
            log.warning("remote cache %s answers again: the tier is back on", self.store.name)
            return

    def _note(self, what: str) -> None:
        with self.lock:
            self.recent.append((time.time(), what))

    def _timed(self, began: float) -> None:
        if self.latency is not None:
            with self.lock:
                self.latency.add(time.monotonic() - began)

    # -- what it says of itself ------------------------------------------------------------------
    def to_proto(self) -> svc.RemoteStats:
        now = time.time()
        with self.lock:
            recent = [
                f"{time.strftime('%H:%M:%S', time.localtime(t))} {what}"
                for t, what in self.recent
                if now - t <= RECENT_S
            ]
            p50 = self.latency.percentile(0.5) if self.latency is not None else 0.0
            p99 = self.latency.percentile(0.99) if self.latency is not None else 0.0
            return svc.RemoteStats(
                store=self.store.name,
                off=self.down,
                hits=self.hits,
                misses=self.misses,
                skipped=self.skipped,
                puts=self.puts,
                put_errors=self.put_errors,
                puts_dropped=self.puts_dropped,
                signature_failures=self.forged,
                refused=self.refused,
                joined=self.joined,
                errors=self.errors,
                latency_p50_ms=1000 * p50,
                latency_p99_ms=1000 * p99,
                recent_errors=recent,
            )

    def close(self) -> None:
        self._closed.set()
        try:
            self._writes.put_nowait(None)
        except queue.Full:
            pass
        self._writer.join(timeout=2)
        self.store.close()


def _refused_write(error: StoreError) -> bool:
    """A write the store answered and refused (full: `maxmemory` with noeviction): the store
    is there, so the tier stays on; only that write is lost."""
    return "OOM" in str(error) or "maxmemory" in str(error)
