"""Fusion: nodes that feed each other become one kernel whose intermediates stay in SBUF
(no HBM round trip, no launch of their own).

Groups are elementwise chains, reductions with their producers, a matmul with its epilogue
(bias, activation, residual add), norm layers, and a copy_ of a value the group computes
into a destination of the same shape and layout (a cast, or a functionalized graph's
write-back): the group writes its result there. A matmul, any other copy, a gather or a
collective starts a group of its own.

Like XLA's fusion, a node joins the group it reads from even when other kernels come
between them in program order; a node reading from several elementwise groups merges them
into one (multi-output fusion), and one reading only tensors an elementwise group already
loads joins it (sibling fusion). Each move happens only where it is legal: nothing the
moved nodes pass over writes what they read, or reads or writes what they write. A fill
of a broadcast constant (passes.broadcast_constants) is no one's producer: its consumers
make the constant themselves.
"""

from __future__ import annotations

from trnsim.compiler.graph import Graph, Node, Value
from trnsim.compiler.lower import Kernel, read_values
from trnsim.compiler.passes import broadcast_constants, view_bases
from trnsim.protos import executable_pb2 as ex

C = ex.InstructionClass
JOINS = frozenset(
    {
        C.TENSOR_TENSOR,
        C.TENSOR_SCALAR,
        C.ACTIVATION,
        C.REDUCTION,
        C.NORMALIZATION,
        C.VIEW,
        C.GENERIC,
    }
)
MAX_GROUP = 64


def fuse(g: Graph, kernels: list[Kernel], prologues: bool = False) -> list[list[int]]:
    """Node indices per kernel, kernels in the order they run, each in program order;
    every node in exactly one group.

    prologues (the schedule search's alternative cut): a matmul fed by the group joins it,
    so what comes before it (a norm, an activation) reaches it through SBUF, not HBM."""
    joins = JOINS | {C.MATMUL} if prologues else JOINS
    f = _Fuser(g, broadcast_constants(g))
    for i, (node, k) in enumerate(zip(g.nodes, kernels, strict=True)):
        if i in f.constants:
            f.start(i, pure=False)
        elif k.klass == C.VIEW:
            f.place_view(i)
        elif k.klass in joins:
            f.join(i, hoistable=k.klass in JOINS)
        elif _epilogue(g, node, f):
            f.join(i, hoistable=True)
        else:
            f.start(i, pure=False)
    return f.groups()


class _Fuser:
    """Groups built in program order. A group's id is its place in the run order; merging
    groups keeps the earliest one's id (a union-find whose representative is the minimum)."""

    def __init__(self, g: Graph, constants: frozenset[int]) -> None:
        self.g = g
        self.constants = constants
        self.base = view_bases(g)
        self.constant_roots = {v for i in constants for v in g.nodes[i].written_values()}
        self.parent: list[int] = []
        self.members: list[list[int]] = []
        self.pure: list[bool] = []  # elementwise only: may run earlier, merged into another
        self.group_of: list[int] = []  # per node, the group it joined (find() it)
        self.readers: dict[Value, list[int]] = {}  # root value -> groups that read it
        self.writers: dict[Value, list[int]] = {}

    def find(self, gid: int) -> int:
        while self.parent[gid] != gid:
            self.parent[gid] = self.parent[self.parent[gid]]
            gid = self.parent[gid]
        return gid

    def groups(self) -> list[list[int]]:
        return [sorted(m) for gid, m in enumerate(self.members) if self.parent[gid] == gid]

    def start(self, i: int, pure: bool) -> None:
        gid = len(self.members)
        self.parent.append(gid)
        self.members.append([])
        self.pure.append(pure)
        self._add(i, gid)

    def _add(self, i: int, gid: int) -> None:
        self.members[gid].append(i)
        self.group_of.append(gid)
        if i in self.constants or self.g.nodes[i].aliases and not self.g.nodes[i].writes():
            return  # a view or a folded constant touches no data
        node = self.g.nodes[i]
        for v in self._reads(node):
            self.readers.setdefault(v, []).append(gid)
        for v in node.written_values():
            self.writers.setdefault(self.base.get(v, v), []).append(gid)

    def _reads(self, node: Node) -> set[Value]:
        roots = {self.base.get(v, v) for v in read_values(node)}
        return roots - self.constant_roots

    def producers(self, node: Node) -> set[int]:
        """The groups computing what the node reads (through views: a view is free)."""
        found = set()
        for v in read_values(node):
            source = self._source(v)
            if source.node is not None and source.node not in self.constants:
                found.add(self.find(self.group_of[source.node]))
        return found

    def _source(self, v: Value) -> Value:
        while v.node is not None:
            node = self.g.nodes[v.node]
            alias = next((a for a in node.aliases if a.output == v.index), None)
            if alias is None or alias.writes:
                break
            source = node.args[alias.argument][1]
            assert isinstance(source, Value), "validated: aliases name tensors"
            v = source
        return v

    def place_view(self, i: int) -> None:
        """A view runs nowhere: it goes with what it views (or the kernel before it)."""
        viewed = [self._source(v) for v in self.g.nodes[i].tensor_args()]
        anchor = viewed[0].node if viewed and viewed[0].node is not None else i - 1
        gid = self.find(self.group_of[anchor]) if anchor >= 0 else -1
        if gid < 0 or len(self.members[gid]) >= MAX_GROUP:
            self.start(i, pure=True)
        else:
            self._add(i, gid)

    def join(self, i: int, hoistable: bool) -> None:
        """Node i joins (and merges) the groups it reads from, or a sibling, where legal."""
        node = self.g.nodes[i]
        sources = self.producers(node)
        if not sources:
            sources = self._siblings(node) if hoistable else set()
        merged = self._merge_set(i, sources)
        if merged is None:
            self.start(i, pure=hoistable)
            return
        target = min(merged)
        for gid in sorted(merged - {target}):
            for n in self.members[gid]:
                self.group_of[n] = target
            self.members[target] += self.members[gid]
            self.members[gid] = []
            self.parent[gid] = target
            self.pure[target] = self.pure[target] and self.pure[gid]
        self._add(i, target)
        self.pure[target] = self.pure[target] and hoistable

    def _siblings(self, node: Node) -> set[int]:
        """The latest elementwise group that already loads a tensor the node reads."""
        found = [self.find(x) for v in self._reads(node) for x in self.readers.get(v, [])]
        pure = [gid for gid in found if self.pure[gid]]
        return {max(pure)} if pure else set()

    def _merge_set(self, i: int, sources: set[int]) -> set[int] | None:
        """The groups node i may run in, merged: all its sources (the later ones elementwise,
        run earlier at the first one's place) or, failing that, just its latest source."""
        for merged in (sources, {max(sources, default=-1)}):
            if not merged or -1 in merged:
                return None
            size = sum(len(self.members[gid]) for gid in merged)
            target = min(merged)
            moved = [(n, gid) for gid in sorted(merged - {target}) for n in self.members[gid]]
            if (
                size < MAX_GROUP
                and all(self.pure[gid] for gid in merged - {target})
                and all(self._may_move(n, gid, target, merged) for n, gid in moved)
                and self._may_move(i, len(self.members), target, merged)
            ):
                return merged
        return None

    def _may_move(self, n: int, home: int, target: int, merged: set[int]) -> bool:
        """Whether node n, now in group `home`, may run in group `target` instead: no group
        between the two that stays where it is computes, writes or reads what would make
        the move change what n reads or what others read."""
        node = self.g.nodes[n]
        if node.aliases and not node.writes():
            return True

        def between(groups: list[int]) -> bool:
            return any(target < gid < home and gid not in merged for gid in map(self.find, groups))

        if any(gid not in merged and gid > target for gid in self.producers(node)):
            return False
        if any(between(self.writers.get(v, [])) for v in self._reads(node)):
            return False
        for v in node.written_values():
            root = self.base.get(v, v)
            if between(self.writers.get(root, []) + self.readers.get(root, [])):
                return False
        return True


def _epilogue(g: Graph, node: Node, f: _Fuser) -> bool:
    """A copy_ of a value a group computes (maybe through views) into a destination of the
    same shape and strides (the dtype may differ: engines convert as they write)."""
    if node.name != "aten::copy_":
        return False
    written = list(node.written_values())
    sources = read_values(node)
    if len(written) != 1 or len(sources) != 1 or not f.producers(node):
        return False
    dst, src = g.type_of(written[0]), g.type_of(sources[0])
    return (dst.shape, dst.strides) == (src.shape, src.strides)


def singletons(g: Graph) -> list[list[int]]:
    return [[i] for i in range(len(g.nodes))]
