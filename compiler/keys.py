"""The cache key of a compile: sha256 over a named, ordered list of components.

Each component is logged at debug level, so a miss can be explained by comparing them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass

from trnsim.compiler.graph import Graph, canonical_bytes, canonicalize, from_proto, to_proto
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


# -- explaining a miss: the parts of a key, and the cached key nearest to one -------------------
# What a person can act on, most telling first: another program, other shapes, other dtypes,
# other options, another target, another compiler.
PART_NAMES = ("program", "shapes", "dtypes", "options", "target", "compiler_version")
TEXT_LIMIT = 160  # characters of a part's readable text


@dataclass(frozen=True)
class KeyPart:
    name: str
    digest: str
    text: str  # readable, cut to TEXT_LIMIT


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."


def key_parts(
    graph: graph_pb2.Graph, target: Target, options: ex.CompileOptions | None = None
) -> list[KeyPart]:
    """A compile's key split into parts a person can compare: the program without its types,
    the shapes, the dtypes, the options, the target, the compiler (not the key's own
    components: those hash the graph whole)."""
    canonical = to_proto(canonicalize(from_proto(graph))[0])
    types = [*canonical.inputs, *(t for n in canonical.nodes for t in n.outputs)]
    shapes = [(tuple(t.shape), tuple(t.strides), t.storage_offset) for t in types]
    ins = " ".join(graph_pb2.DType.Name(t.dtype).lower() for t in canonical.inputs) or "none"
    outs = " ".join(
        graph_pb2.DType.Name(t.dtype).lower() for n in canonical.nodes for t in n.outputs
    )
    dtypes = f"in {ins}; out {outs}"
    untyped = graph_pb2.Graph()
    untyped.CopyFrom(canonical)
    for t in [*untyped.inputs, *(t for n in untyped.nodes for t in n.outputs)]:
        t.Clear()
    ops = [n.op for n in canonical.nodes]
    kept = ex.CompileOptions.FromString(options_bytes(options or ex.CompileOptions()))
    inputs = " ".join(str(list(t.shape)) for t in canonical.inputs) or "none"
    outputs = " ".join(str(list(t.shape)) for n in canonical.nodes for t in n.outputs)
    return [
        KeyPart(
            "program",
            _sha(untyped.SerializeToString(deterministic=True)),
            _cut(f"{len(ops)} ops: {' '.join(ops)}"),
        ),
        KeyPart("shapes", _sha(repr(shapes).encode()), _cut(f"in {inputs}; out {outputs}")),
        KeyPart("dtypes", _sha(dtypes.encode()), _cut(dtypes)),
        KeyPart(
            "options", _sha(options_bytes(kept)), _cut(str(kept).replace("\n", " ") or "defaults")
        ),
        KeyPart("target", _sha(target_bytes(target)), target.name),
        KeyPart("compiler_version", _sha(compiler_version().encode()), compiler_version()),
    ]


def nearest(
    mine: list[KeyPart], candidates: list[tuple[str, list[KeyPart]]]
) -> tuple[str, list[KeyPart]] | None:
    """The candidate (key, parts) sharing the most parts with `mine`, ties broken by the
    earlier part names (the same program first); None without candidates."""
    digests = {p.name: p.digest for p in mine}

    def score(parts: list[KeyPart]) -> tuple[int, ...]:
        same = {p.name for p in parts if digests.get(p.name) == p.digest}
        return (len(same), *(name in same for name in PART_NAMES))

    best = max(candidates, key=lambda c: score(c[1]), default=None)
    return best


def differences(mine: list[KeyPart], theirs: list[KeyPart]) -> list[str]:
    """'name: mine (nearest cached: theirs)' for each part that differs."""
    other = {p.name: p for p in theirs}
    out = []
    for p in mine:
        q = other.get(p.name)
        if q is None or q.digest != p.digest:
            out.append(f"{p.name}: {p.text} (nearest cached: {q.text if q else 'unknown'})")
    return out
