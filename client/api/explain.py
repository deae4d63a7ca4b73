"""torch.neuron.explain(): why the runtime did what it did, at the user's lines.

- Adaptive mode's cuts: each place a recorded graph was cut (reason, the op the graph ended
  with, the user's file:line that caused it), counted.
- Compiled mode: dynamo's graph breaks (its reasons, counted), each recompiled function with
  the guard failures behind it, graphs that ran eagerly instead and shape buckets
  (client/modes/compiled.py).
- Eager ops run in shape buckets: each op at a user's line whose sizes turned dynamic, which
  sizes, the buckets compiled and the signatures run in them (client/door/buckets.py).
- Shape-only mode (NEURON_SIM_NUMERICS=off): each value the host read, which is a
  placeholder, and each data-dependent shape taken by assumption, at the user's lines.

`print(torch.neuron.explain())` is a table; `.to_json()` the same as data.
NEURON_EXPLAIN=FILE writes the report at exit; `trnsim explain FILE` prints it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from trnsim.client.core import env
from trnsim.client.core.notes import NOTES, PLACEHOLDER, ShapeOnlyWarning, reset

if TYPE_CHECKING:
    from trnsim.client.core.executables import Executables
    from trnsim.client.modes.compiled import Explained

# Why a recorded graph was cut (policy/boundaries.py, and the callers of Runtime.flush).
REASONS = {
    "sync": "the host needed the device's results (.item(), .cpu(), print, synchronize)",
    "first_sight": "an op signature met for the first time runs on its own (its outputs "
    "are checked once); the next time it is recorded",
    "dynamic_shape": "an op whose output shape depends on the data (nonzero, masked_select)",
    "not_fusible": "an op the compiler cannot put in a graph",
    "stream_change": "work moved to another stream",
    "size_cap": "the graph reached its size limit (1024 ops)",
    "hazard": "the host wrote memory the recorded ops read (a copy from the CPU, an alias)",
    "queue_drained": "the device ran out of work while a long graph was being recorded",
    "collective": "a collective (torch.distributed)",
    "sparse": "a sparse op (never recorded)",
    "compiled_region": "a torch.compile'd region started",
    "profile": "a profile block started or ended",
}
MAX_ROWS = 25  # the table's longest; to_json() has every row
NO_USER_LINE = "<unknown>"  # autograd's backward runs on its own thread: no line of yours
# (the notes this report reads: client/core/notes.py)
__all__ = ["PLACEHOLDER", "REASONS", "Report", "ShapeOnlyWarning", "explain", "main", "reset"]


# The report's rows, as to_json() gives them.
class CutRow(TypedDict):
    reason: str
    op: str
    where: str  # file:line
    function: str
    count: int


class GraphBreakRow(TypedDict):
    reason: str
    where: str  # the innermost frame dynamo traced
    inside: str  # the outermost one
    count: int


class MissRow(TypedDict):
    name: str
    ops: int
    where: str
    key: str
    nearest: str  # the nearest cached key ("": none)
    against: str  # which cache it was compared with
    differs: list[str]


class OpBucketRow(TypedDict):
    op: str
    where: str  # file:line
    dynamic: str  # which sizes, and the values met that made them dynamic
    buckets: list[str]  # each bucket's sizes, tensor by tensor
    signatures: int  # signatures run in them (computed at their sizes, priced at the bucket)
    refused: list[str]  # why a bucket could not be compiled (its sizes then compile one by one)


class ShapeOnlyRow(TypedDict):
    kind: str  # "placeholder" | "assumed" | "computed"
    op: str
    what: str
    where: str
    count: int


@dataclass
class Report:
    cuts: list[CutRow] = field(default_factory=list)
    graph_breaks: list[GraphBreakRow] = field(default_factory=list)
    compiled: list[Explained] = field(default_factory=list)
    misses: list[MissRow] = field(default_factory=list)
    shape_only: list[ShapeOnlyRow] = field(default_factory=list)
    op_buckets: list[OpBucketRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Sequence[Mapping[str, object]]]:
        return {
            "cuts": self.cuts,
            "graph_breaks": self.graph_breaks,
            "compiled": self.compiled,
            "misses": self.misses,
            "shape_only": self.shape_only,
            "op_buckets": self.op_buckets,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Report:
        return Report(
            data["cuts"],
            data["graph_breaks"],
            data["compiled"],
            data.get("misses", []),
            data.get("shape_only", []),
            data.get("op_buckets", []),
        )

    def __str__(self) -> str:
        lines = [f"adaptive mode: {sum(c['count'] for c in self.cuts)} graph cuts"]
        if self.cuts:
            lines.append(f"  {'count':>6}  {'reason':<14} {'graph ended with':<30} where")
            for c in self.cuts[:MAX_ROWS]:
                where = (
                    "in backward (autograd's thread: no line of yours)"
                    if c["where"].startswith(NO_USER_LINE)
                    else f"{c['where']} ({c['function']})"
                )
                lines.append(f"  {c['count']:>6}  {c['reason']:<14} {c['op']:<30} {where}")
            if len(self.cuts) > MAX_ROWS:
                lines.append(f"  ... {len(self.cuts) - MAX_ROWS} more places (to_json() has all)")
            for reason in sorted({c["reason"] for c in self.cuts}):
                lines.append(f"  {reason}: {REASONS.get(reason, reason)}")
        lines.append(f"compiled mode: {sum(b['count'] for b in self.graph_breaks)} graph breaks")
        for b in self.graph_breaks:
            lines.append(f"  {b['count']:>6}  {b['reason']}")
            if b.get("where"):
                inside = f", inside {b['inside']}" if b.get("inside") else ""
                lines.append(f"          at {b['where']}{inside}")
        for item in self.compiled:
            if "function" in item:
                what = item.get("module") or f"{item['function']} at {item['where']}"
                called = f", called at {item['called_at']}" if item.get("called_at") else ""
                lines.append(
                    f"  recompiled {what}{called}: {item['recompiles']} "
                    f"times: {'; '.join(item['reasons'][:3])}"
                )
            else:
                kind, text = next(iter(item.items()))
                lines.append(f"  {kind.replace('_', ' ')}: {text}")
        lines.extend(_op_buckets_table(self.op_buckets))
        lines.extend(_misses_table(self.misses))
        if self.shape_only:
            lines.append(
                "shape-only mode (NEURON_SIM_NUMERICS=off): values the host read and "
                "data-dependent shapes taken by assumption"
            )
            for a in self.shape_only[:MAX_ROWS]:
                lines.append(f"  {a['count']:>6}  {a['kind']:<11} {a['op']} at {a['where']}")
                lines.append(f"          {a['what']}")
            if len(self.shape_only) > MAX_ROWS:
                lines.append(f"  ... {len(self.shape_only) - MAX_ROWS} more (to_json() has all)")
        return "\n".join(lines)


def _op_buckets_table(rows: list[OpBucketRow]) -> list[str]:
    """Eager ops whose sizes turned dynamic: where, which sizes, the buckets they run in."""
    if not rows:
        return []
    head = (
        f"eager shape buckets: {len(rows)} ops at your lines met one size with several "
        "values; each compiles per bucket, computed at its size and priced at the bucket's"
    )
    lines = [head]
    for r in rows[:MAX_ROWS]:
        where = (
            "in backward (autograd's thread: no line of yours)"
            if r["where"].startswith(NO_USER_LINE)
            else f"at {r['where']}"
        )
        lines.append(f"  {r['op']} {where}: {r['dynamic'] or 'no bucket'}")
        if r["buckets"]:
            lines.append(
                f"      {r['signatures']} signatures in {len(r['buckets'])} buckets: "
                + "; ".join(r["buckets"][:6])
                + (" ..." if len(r["buckets"]) > 6 else "")
            )
        for why in r["refused"][:3]:
            lines.append(f"      no bucket: {why}")
    if len(rows) > MAX_ROWS:
        lines.append(f"  ... {len(rows) - MAX_ROWS} more (to_json() has all)")
    return lines


def _op_buckets() -> list[OpBucketRow]:
    """The notes of eager shape buckets, one row per op and line."""
    rows: dict[tuple[str, str], OpBucketRow] = {}

    def row(op: str, where: str) -> OpBucketRow:
        empty: OpBucketRow = {
            "op": op, "where": where, "dynamic": "", "buckets": [], "signatures": 0, "refused": []
        }  # fmt: skip
        return rows.setdefault((op, where), empty)

    for (op, where, bucket), n in NOTES.op_buckets.items():
        r = row(op, where)
        r["dynamic"] = NOTES.op_bucket_sizes.get((op, where), "")
        r["buckets"].append(bucket)
        r["signatures"] += n
    for op, where, why in NOTES.op_buckets_refused:
        row(op, where)["refused"].append(why)
    return list(rows.values())


def _misses_table(misses: list[MissRow]) -> list[str]:
    """The misses whose program a cached key runs too, each with what differed (the telling
    ones: other shapes, dtypes, options...); the others, new programs, in one line."""
    known = [m for m in misses if m["nearest"] and not _new_program(m)]
    new = [m for m in misses if m not in known]
    head = (
        f"cache misses: {len(misses)} compiles missed every cache; {len(known)} of them "
        f"compiled a program already cached with other parts (compared with {_against(misses)})"
    )
    lines = [head]
    for m in known[:MAX_ROWS]:
        where = f" at {m['where']}" if m["where"] else ""
        lines.append(f"  {m['name']} ({m['ops']} ops){where}")
        for d in m["differs"] or ["the same parts as a cached key (evicted or expired)"]:
            lines.append(f"      {d}")
    if len(known) > MAX_ROWS:
        lines.append(f"  ... {len(known) - MAX_ROWS} more (to_json() has all)")
    if new:
        names = ", ".join(dict.fromkeys(m["name"] for m in new))
        lines.append(f"  {len(new)} new programs, no cached key runs their ops: {names[:300]}")
    return lines


def _new_program(miss: MissRow) -> bool:
    return any(d.startswith("program:") for d in miss["differs"])


def _against(misses: list[MissRow]) -> str:
    return misses[0]["against"] if misses else "the cache"


def _graph_breaks() -> list[GraphBreakRow]:
    """Dynamo's graph breaks by reason and by the line where each happened (the innermost
    frame dynamo was tracing) and the outermost frame of that trace."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return []
    breaks: Counter[tuple[str, str, str]] = Counter()
    for b in dynamo.graph_break_reasons:
        stack = b.user_stack
        at = f"{stack[-1].filename}:{stack[-1].lineno} ({stack[-1].name})" if stack else ""
        top = f"{stack[0].filename}:{stack[0].lineno} ({stack[0].name})" if len(stack) > 1 else ""
        breaks[((b.reason.splitlines() or [""])[0][:200], at, top)] += 1
    return [
        {"reason": r, "where": at, "inside": top, "count": n}
        for (r, at, top), n in breaks.most_common()
    ]


def explain() -> Report:
    from trnsim.client.core import runtime

    with NOTES.quiet():
        runtime.get().flush("sync")
    cuts: list[CutRow] = [
        {"reason": r, "op": op, "where": f"{path}:{line}", "function": fn, "count": n}
        for (r, op, path, line, fn), n in NOTES.cuts.most_common()
    ]
    compiled: list[Explained] = []
    if "trnsim.client.modes.compiled" in sys.modules:
        from trnsim.client.modes import compiled as compiled_mode

        compiled = compiled_mode.explain()
    shape_only: list[ShapeOnlyRow] = [
        {"kind": kind, "op": op, "what": what, "where": f"{path}:{line}", "count": n}
        for (kind, op, what, path, line), n in NOTES.shape_only.most_common()
    ]
    return Report(
        cuts,
        _graph_breaks(),
        compiled,
        _misses(runtime.get().executables),
        shape_only,
        _op_buckets(),
    )


def _misses(executables: Executables) -> list[MissRow]:
    """Each compile that missed every cache, with the parts of its key that differ from the
    nearest key cached before it: the daemon's (it answers a Nearest query), or without a
    daemon the nearest of this process's earlier compiles."""
    from trnsim import compiler

    misses = list(executables.misses)
    target = executables.target
    parts = [(m.key, compiler.key_parts(m.graph, target, m.options)) for m in misses]
    answers = executables.compiler.nearest(parts)
    against = "the daemon's cache"
    if answers is None:
        against = "this process's compiles"
        answers = [
            compiler.nearest(mine, [c for c in parts[:i] if c[0] != key])
            for i, (key, mine) in enumerate(parts)
        ]
    out: list[MissRow] = []
    for m, (_, mine), near in zip(misses, parts, answers, strict=True):
        out.append(
            {
                "name": m.name,
                "ops": m.ops,
                "where": m.where,
                "key": m.key,
                "nearest": near[0] if near else "",
                "against": against,
                "differs": compiler.differences(mine, near[1]) if near else [],
            }
        )
    return out


def write_at_exit() -> None:
    """NEURON_EXPLAIN=FILE: the report is written there when the process exits, if it used
    the device (under torchrun each rank its own file, as NEURON_PROFILE's: "{rank}" in the
    name, or "-rank<N>" added)."""
    path = env.explain_path()
    if path:
        from trnsim.client.core.profiler import trace_path

        atexit.register(_write, Path(trace_path(path)))


def _write(path: Path) -> None:
    from trnsim.client.core import runtime

    if not runtime.initialized():  # (a process that never used the device: nothing to say)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(explain().to_json(), indent=1) + "\n")
    tmp.replace(path)
    print(f"trnsim: explanations written to {path} (trnsim explain {path})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """`trnsim explain FILE`: the report NEURON_EXPLAIN wrote."""
    import argparse

    p = argparse.ArgumentParser(
        prog="trnsim explain",
        description="Prints the report NEURON_EXPLAIN=FILE wrote at a run's exit: adaptive "
        "mode's graph cuts at your lines, compiled mode's graph breaks and recompiles, eager "
        "ops run in shape buckets.",
    )
    p.add_argument("file", help="a report NEURON_EXPLAIN=FILE wrote")
    args = p.parse_args(argv)
    try:
        report = Report.from_json(json.loads(Path(args.file).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.file} is not an explain report ({e})", file=sys.stderr)
        return 2
    print(report)
    return 0
