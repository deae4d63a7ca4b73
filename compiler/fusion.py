"""Fusion: consecutive nodes that feed each other become one kernel whose intermediates
stay in SBUF (no HBM round trip, no launch of their own).

Groups are runs in program order: elementwise chains, reductions with their producers,
a matmul with its epilogue (bias, activation, residual add), norm layers, and a copy_ of
a value the group computes into a destination of the same shape and layout (a cast, or a
functionalized graph's write-back): the group writes its result there. A matmul, any other
copy, a gather or a collective starts a group of its own.
"""

from __future__ import annotations

from trnsim.compiler.graph import Graph, Node
from trnsim.compiler.lower import Kernel, read_values
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
    """Node indices per kernel, in program order; every node in exactly one group.

    prologues (the schedule search's alternative cut): a matmul fed by the group joins it,
    so what comes before it (a norm, an activation) reaches it through SBUF, not HBM."""
    groups: list[list[int]] = []
    current: list[int] = []
    in_current: set[int] = set()
    joins = JOINS | {C.MATMUL} if prologues else JOINS
    for i, (node, k) in enumerate(zip(g.nodes, kernels, strict=True)):
        feeds = any(v.node is not None and v.node in in_current for v in node.tensor_args())
        joins_current = k.klass in joins or _epilogue(g, node, in_current)
        if current and joins_current and (feeds or k.klass == C.VIEW) and len(current) < MAX_GROUP:
            current.append(i)
            in_current.add(i)
            continue
        if current:
            groups.append(current)
        current, in_current = [i], {i}
    if current:
        groups.append(current)
    return groups


def _epilogue(g: Graph, node: Node, in_current: set[int]) -> bool:
    """A copy_ of a value the current group computes into a destination of the same shape
    and strides (the dtype may differ: engines convert as they write)."""
    if node.name != "aten::copy_":
        return False
    written = list(node.written_values())
    sources = read_values(node)
    if len(written) != 1 or len(sources) != 1 or sources[0].node not in in_current:
        return False
    dst, src = g.type_of(written[0]), g.type_of(sources[0])
    return (dst.shape, dst.strides) == (src.shape, src.strides)


def singletons(g: Graph) -> list[list[int]]:
    return [[i] for i in range(len(g.nodes))]
