"""The cache key of a compile: sha256 over a named, ordered list of components.

Each component is logged at debug level, so a miss can be explained by comparing them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass

from trnsim.compiler.graph import Graph, canonical_bytes, from_proto
from trnsim.compiler.version import FORMAT_VERSION, compiler_version
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator.config import Target

log = logging.getLogger(__name__)

# Options that change how a compile is observed, never what it produces.
DEBUG_ONLY_OPTIONS = frozenset({"emit_debug_info", "debug_crash_worker", "debug_sleep_ms"})


@dataclass(frozen=True)
class CacheKey:
    digest: str
    components: tuple[tuple[str, str], ...]  # (name, sha256 hex of that component)

    def __str__(self) -> str:
        return self.digest

    def explain(self, other: CacheKey) -> list[str]:
        """Names of the components that differ between two keys."""
        mine, theirs = dict(self.components), dict(other.components)
        return [name for name in mine if mine[name] != theirs.get(name)]


def options_bytes(options: ex.CompileOptions) -> bytes:
    kept = ex.CompileOptions()
    kept.CopyFrom(options)
    for name in DEBUG_ONLY_OPTIONS:
        kept.ClearField(name)
    if kept.opt_level == 1:
        kept.ClearField("opt_level")  # -O1 is the default level: one key for both spellings
    return kept.SerializeToString(deterministic=True)


def target_bytes(target: Target) -> bytes:
    return json.dumps(target.as_dict(), sort_keys=True).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(graph: Graph, target: Target, options: ex.CompileOptions | None = None) -> CacheKey:
    return _key(canonical_bytes(graph), target, options)


def _inputs_in_first_use_order(graph: graph_pb2.Graph) -> bool:
    expected = 0

    def visit(arg: graph_pb2.Argument) -> bool:
        nonlocal expected
        kind = arg.WhichOneof("value")
        if kind == "list":
            return all(visit(a) for a in arg.list.items)
        if kind == "tensor" and arg.tensor.WhichOneof("kind") == "input":
            if arg.tensor.input > expected:
                return False
            expected += arg.tensor.input == expected
        return True

    ok = all(visit(a) for node in graph.nodes for a in node.args)
    return ok and expected == len(graph.inputs)


def cache_key_from_proto(
    graph: graph_pb2.Graph, target: Target, options: ex.CompileOptions | None = None
) -> CacheKey:
    """The same key as cache_key(from_proto(graph)), without building the IR when the graph
    is already canonical (what clients send): its deterministic bytes are the canonical ones.
    Fields this version does not know are not part of a graph: they are dropped first."""
    graph.DiscardUnknownFields()
    if _inputs_in_first_use_order(graph):
        return _key(graph.SerializeToString(deterministic=True), target, options)
    return cache_key(from_proto(graph), target, options)


def _key(graph_bytes: bytes, target: Target, options: ex.CompileOptions | None) -> CacheKey:
    raw_options = (options or ex.CompileOptions()).SerializeToString(deterministic=True)
    components = (("graph", _sha(graph_bytes)), *_fixed_components(target, raw_options))
    outer = hashlib.sha256()
    for name, digest in components:
        outer.update(f"{name}={digest}\n".encode())
    key = CacheKey(outer.hexdigest(), components)
    if log.isEnabledFor(logging.DEBUG):
        for name, digest in components:
            log.debug("cache key component %s = %s", name, digest)
        log.debug("cache key %s", key.digest)
    return key


@functools.lru_cache(maxsize=256)
def _fixed_components(target: Target, raw_options: bytes) -> tuple[tuple[str, str], ...]:
    """The components other than the graph: the same for most compiles of a process."""
    return (
        ("compiler_version", _sha(compiler_version().encode())),
        ("format_version", _sha(str(FORMAT_VERSION).encode())),
        ("target", _sha(target_bytes(target))),
        ("options", _sha(options_bytes(ex.CompileOptions.FromString(raw_options)))),
    )
