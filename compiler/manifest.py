"""A precompile manifest: every graph a run compiled or fetched, with its target and options,
so that `trnsim precompile` can fill the daemon's cache before the next run.

On disk it is a sequence of records, each a 4-byte little-endian length and a serialized
CompileRequest (protobuf: nothing here is pickled). A run adds its graphs at exit under a
lock beside the file, so several ranks or runs build one manifest; a graph is kept once
(by its cache key).
"""

from __future__ import annotations

import fcntl
import os
import struct
import tempfile
from collections.abc import Iterable
from pathlib import Path

from trnsim.compiler.keys import cache_key_from_proto
from trnsim.protos import compile_service_pb2 as svc
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator.config import get_target

_LENGTH = struct.Struct("<I")
MAX_RECORD_BYTES = 64 * 1024 * 1024  # the daemon's own request limit


class ManifestError(ValueError):
    """A file that is not a manifest (or a damaged one)."""


def request(
    graph: graph_pb2.Graph,
    debug: graph_pb2.GraphDebug | None,
    target: str,
    options: executable_pb2.CompileOptions,
) -> svc.CompileRequest:
    r = svc.CompileRequest(graph=graph, target=target, options=options)
    if debug is not None:
        r.debug.CopyFrom(debug)
    return r


def key_of(r: svc.CompileRequest) -> str:
    graph = graph_pb2.Graph()
    graph.CopyFrom(r.graph)
    return cache_key_from_proto(graph, get_target(r.target), r.options).digest


def read(path: Path) -> dict[str, svc.CompileRequest]:
    """The manifest's requests by cache key."""
    data = path.read_bytes()
    out: dict[str, svc.CompileRequest] = {}
    at = 0
    while at < len(data):
        if at + _LENGTH.size > len(data):
            raise ManifestError(f"{path}: ends inside a record's length (a truncated manifest)")
        (n,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if n > MAX_RECORD_BYTES or at + n > len(data):
            raise ManifestError(f"{path}: a record of {n} bytes at byte {at} runs past the file")
        r = svc.CompileRequest()
        try:
            r.ParseFromString(data[at : at + n])
            key = key_of(r)
        except Exception as e:  # (anything undecodable is a damaged file)
            raise ManifestError(f"{path}: the record at byte {at} is not a graph ({e})") from e
        out[key] = r
        at += n
    return out


def write(path: Path, requests: Iterable[svc.CompileRequest]) -> None:
    """Written whole to a new file of our own beside it (never through a link someone placed
    there), then renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for r in requests:
                data = r.SerializeToString(deterministic=True)
                f.write(_LENGTH.pack(len(data)))
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def merge_into(path: Path, requests: dict[str, svc.CompileRequest]) -> int:
    """Adds requests to the manifest at path (made if missing); processes take turns on a
    lock file beside it. Returns how many graphs the manifest holds after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = read(path) if path.exists() else {}
        for key, r in requests.items():
            merged.setdefault(key, r)
        write(path, [merged[k] for k in sorted(merged)])
    return len(merged)
