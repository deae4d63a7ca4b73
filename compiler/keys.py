"""The cache key of a compile: sha256 over a named, ordered list of components.

Each component is logged at debug level, so a miss can be explained by comparing them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from trnsim.compiler.graph import Graph, canonical_bytes
from trnsim.compiler.version import FORMAT_VERSION, compiler_version
from trnsim.protos import executable_pb2 as ex
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
    return kept.SerializeToString(deterministic=True)


def target_bytes(target: Target) -> bytes:
    return json.dumps(target.as_dict(), sort_keys=True).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(graph: Graph, target: Target, options: ex.CompileOptions | None = None) -> CacheKey:
    components = (
        ("graph", _sha(canonical_bytes(graph))),
        ("compiler_version", _sha(compiler_version().encode())),
        ("format_version", _sha(str(FORMAT_VERSION).encode())),
        ("target", _sha(target_bytes(target))),
        ("options", _sha(options_bytes(options or ex.CompileOptions()))),
    )
    outer = hashlib.sha256()
    for name, digest in components:
        outer.update(f"{name}={digest}\n".encode())
        log.debug("cache key component %s = %s", name, digest)
    key = CacheKey(outer.hexdigest(), components)
    log.debug("cache key %s", key.digest)
    return key
