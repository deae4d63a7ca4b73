"""Recording the shape registry: every distinct op signature the process dispatches to the
device (NEURON_RECORD_SHAPES=FILE), saved at exit into FILE (client/api/registry.py tests them).

A signature is the op overload with, per argument, a tensor's sizes, strides, storage offset,
dtype and device, or the value of anything else (floats included). The file holds one JSON
object per line, sorted: {"op", "args", "kwargs", "count", "sources"}; recording into an
existing file adds to its counts.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from trnsim.client.core import env
from trnsim.client.core.types import Kwargs, OpValue


# -- recording --------------------------------------------------------------------------------
def encode(value: OpValue) -> object:
    """An op argument as JSON: tensors by their metadata, everything else by value."""
    if isinstance(value, torch.Tensor):
        return {
            "tensor": list(value.shape),
            "stride": list(value.stride()),
            "offset": value.storage_offset(),
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": value.device.type,
        }
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if isinstance(value, complex):
        return {"complex": [encode(value.real), encode(value.imag)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, (torch.memory_format, torch.layout)):
        return {type(value).__name__: str(value).removeprefix("torch.")}
    return {"unsupported": type(value).__name__}


@dataclass
class Signature:
    op: str
    args: list[object]  # encoded (encode)
    kwargs: dict[str, object]
    count: int = 0
    sources: set[str] = field(default_factory=set)

    def key(self) -> str:
        return json.dumps([self.op, self.args, self.kwargs], sort_keys=True)

    def to_json(self) -> dict[str, object]:
        return {
            "op": self.op,
            "args": self.args,
            "kwargs": self.kwargs,
            "count": self.count,
            "sources": sorted(self.sources),
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Signature:
        return Signature(d["op"], d["args"], d["kwargs"], d["count"], set(d["sources"]))


class ShapeLog:
    """What one process dispatched, keyed by the runtime's own signature (cheap to count)."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        self.seen: dict[tuple[object, ...], Signature] = {}

    def add(
        self, name: str, key: tuple[object, ...], args: Sequence[OpValue], kwargs: Kwargs
    ) -> None:
        sig = self.seen.get(key)
        if sig is None:
            sig = Signature(
                name, [encode(a) for a in args], {k: encode(v) for k, v in kwargs.items()}
            )
            sig.sources.add(self.source)
            self.seen[key] = sig
        sig.count += 1

    def save(self) -> None:
        """Merges into the file (counts add up): several runs build one registry, processes
        running at once included (they take turns on a lock file beside it)."""
        import fcntl

        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged = {s.key(): s for s in load(self.path)} if self.path.exists() else {}
            for sig in self.seen.values():
                known = merged.setdefault(sig.key(), Signature(sig.op, sig.args, sig.kwargs))
                known.count += sig.count
                known.sources |= sig.sources
            write(self.path, merged.values())
        self.seen.clear()


active: ShapeLog | None = None  # the process's recording (dispatch.kernel adds to it)


def start_from_env() -> None:
    """NEURON_RECORD_SHAPES=FILE: record this process's op signatures, saved at exit."""
    global active
    path = env.record_shapes()
    if not path or active is not None:
        return
    import atexit

    active = ShapeLog(Path(path), default_source())
    atexit.register(active.save)


class RegistryFileError(ValueError):
    """A registry file that is not one JSON signature per line."""


def _open(path: Path, mode: str) -> IO[str]:
    """The registry file as text; gzip-compressed when its name ends in .gz (a large registry
    kept in the repository: tests/registry/sweep.jsonl.gz)."""
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(path, mode), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def load(path: Path) -> list[Signature]:
    signatures = []
    with _open(path, "r") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                signatures.append(Signature.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise RegistryFileError(
                    f"{path}:{number}: not a recorded op signature ({type(e).__name__}: "
                    f"{str(e)[:120]}); a registry file has one JSON signature per line, as "
                    f"NEURON_RECORD_SHAPES or `trnsim record` write it"
                ) from e
    return signatures


def write(path: Path, signatures: Iterable[Signature]) -> None:
    ordered = sorted(signatures, key=lambda s: (s.op, s.key()))
    tmp = path.with_name(".tmp." + path.name)  # (the same suffix: .gz stays compressed)
    with _open(tmp, "w") as f:
        f.writelines(json.dumps(sig.to_json(), sort_keys=True) + "\n" for sig in ordered)
    os.replace(tmp, path)


def default_source() -> str:
    """NEURON_RECORD_SOURCE, else the script's name: which model a signature came from."""
    return env.record_source() or Path(sys.argv[0] or "python").stem
