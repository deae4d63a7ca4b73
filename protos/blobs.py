"""Executables on the wire and on disk: an ExecutableBlob's digest binds its bytes to the
cache key they were compiled for, so a reader that checks it against the key it asked for
can be handed neither damaged bytes nor another graph's executable (a swapped entry)."""

from __future__ import annotations

import hashlib

from google.protobuf.message import DecodeError
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import executable_pb2


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


def executable_of(
    blob: svc.ExecutableBlob, key: str, compiler_version: str, format_version: int
) -> executable_pb2.Executable | None:
    """The executable a blob carries if it is intact, is the one for `key` and was built by
    this compiler in this format; else None (whoever sent or stored it, nothing is run)."""
    if not blob_ok(blob, key):
        return None
    return checked_executable(blob, key, compiler_version, format_version)


def checked_executable(
    blob: svc.ExecutableBlob, key: str, compiler_version: str, format_version: int
) -> executable_pb2.Executable | None:
    """executable_of() for a blob whose digest was checked already (protos/disk_tier.py)."""
    try:
        exe = executable_pb2.Executable.FromString(blob.data)
    except DecodeError:
        return None
    if (
        exe.cache_key != key
        or exe.format_version != format_version
        or exe.compiler_version != compiler_version
    ):
        return None
    return exe
