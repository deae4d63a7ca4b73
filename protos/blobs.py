"""Executables on the wire and on disk: an ExecutableBlob's digest binds its bytes to the
cache key they were compiled for, so a reader that checks it against the key it asked for
can be handed neither damaged bytes nor another graph's executable (a swapped entry)."""

from __future__ import annotations

import hashlib

from trnsim.protos import compile_service_pb2 as svc


def digest(key: str, data: bytes) -> bytes:
    """sha256 over the cache key, a separator and the executable's bytes."""
    h = hashlib.sha256(key.encode("ascii", "replace"))
    h.update(b"\n")
    h.update(data)
    return h.digest()


def make_blob(data: bytes, format_version: int, key: str) -> svc.ExecutableBlob:
    return svc.ExecutableBlob(data=data, sha256=digest(key, data), format_version=format_version)


def blob_ok(blob: svc.ExecutableBlob, key: str) -> bool:
    """The blob's bytes are intact and are the executable of `key`."""
    return len(blob.sha256) == 32 and digest(key, blob.data) == blob.sha256
