"""Graph rewrites (dead code and common subexpression elimination) and the analyses of
what a value aliases and which fills are broadcast constants."""

from __future__ import annotations

from dataclasses import replace

from trnsim.compiler.graph import Graph, Node, Value, node_to_proto, remap_node, remap_values
from trnsim.compiler.op_table import base_name, classify, has_side_effects
from trnsim.protos import executable_pb2 as ex


def _keep(node: Node) -> bool:
    """Nodes that matter beyond their outputs: writes, RNG, communication, and nodes with no
    outputs at all (in-place list ops such as _foreach_add_ exist only for their effects)."""
    return not node.outputs or node.writes() or has_side_effects(node.name)


def eliminate_dead_code(g: Graph) -> Graph:
    """Drops nodes none of whose outputs reach a graph output or a kept (side-effect) node."""
    live: set[int] = set()
    needed: set[Value] = set(g.outputs)
    for i in range(len(g.nodes) - 1, -1, -1):
        node = g.nodes[i]
        if _keep(node) or any(Value(i, j) in needed for j in range(len(node.outputs))):
            live.add(i)
            needed.update(node.tensor_args())
    return _select(g, sorted(live))


def _select(g: Graph, kept: list[int]) -> Graph:
    """The graph with only nodes `kept` (ascending), references renumbered."""
    if len(kept) == len(g.nodes):
        return g
    new_index = {old: new for new, old in enumerate(kept)}
    mapping = {
        Value(old, j): Value(new, j)
        for old, new in new_index.items()
        for j in range(len(g.nodes[old].outputs))
    }
    remapped = remap_values(g, mapping)
    origin = g.origin or tuple(range(len(g.nodes)))
    return replace(
        remapped,
        nodes=tuple(remapped.nodes[i] for i in kept),
        origin=tuple(origin[i] for i in kept),
    )


def eliminate_common_subexpressions(g: Graph) -> Graph:
    """Merges nodes that compute the same op on the same values with the same arguments.

    Nodes with side effects (in-place writes, random numbers, collectives) are never merged,
    nothing is merged across a write (it may change what an input holds), and a node whose
    result is written later (directly or through a view) keeps its own memory.
    """
    mapping: dict[Value, Value] = {}
    seen: dict[bytes, int] = {}
    kept: list[int] = []
    nodes = list(g.nodes)
    mutated = _mutated_nodes(g)
    for i, node in enumerate(nodes):
        node = remap_node(node, mapping)
        nodes[i] = node
        if _keep(node) or i in mutated:
            seen.clear()  # a write may change any value an earlier node read
            kept.append(i)
            continue
        key = _node_key(node)
        if key in seen:
            twin = seen[key]
            for j in range(len(node.outputs)):
                mapping[Value(i, j)] = Value(twin, j)
            continue
        seen[key] = i
        kept.append(i)
    g = replace(g, nodes=tuple(nodes), outputs=tuple(mapping.get(v, v) for v in g.outputs))
    return _select(g, kept)


def _mutated_nodes(g: Graph) -> set[int]:
    """Nodes whose outputs some later node writes, following views back to their base."""
    base = view_bases(g)
    mutated: set[int] = set()
    for node in g.nodes:
        for value in node.written_values():
            root = base.get(value, value)
            if root.node is not None:
                mutated.add(root.node)
    return mutated


def _node_key(node: Node) -> bytes:
    return node_to_proto(node).SerializeToString(deterministic=True)


def view_bases(g: Graph) -> dict[Value, Value]:
    """For every value that aliases another (a view, or an in-place op's result), the value
    that owns its memory: a graph input or a non-aliasing node output."""
    base: dict[Value, Value] = {}
    for i, node in enumerate(g.nodes):
        for a in node.aliases:
            source = node.args[a.argument][1]
            if isinstance(source, Value):
                base[Value(i, a.output)] = base.get(source, source)
    return base


# What may read a broadcast constant without it being materialised: elementwise passes (the
# engines take a scalar operand or an immediate) and views of it.
_READS_CONSTANTS = frozenset({ex.TENSOR_TENSOR, ex.TENSOR_SCALAR, ex.ACTIVATION, ex.VIEW})


def broadcast_constants(g: Graph) -> frozenset[int]:
    """fill_/zero_ nodes that write a scalar over a whole buffer (not a graph output) that
    later elementwise ops read and nothing else touches: a broadcast constant, which a real compiler folds into its
    consumers (XLA's broadcast of a constant fuses into every consumer) instead of writing
    it to HBM and reading it back."""
    base = view_bases(g)
    outputs = {base.get(v, v) for v in g.outputs}
    touches: dict[Value, list[int]] = {}
    for i, node in enumerate(g.nodes):
        for v in {base.get(v, v) for v in node.tensor_args()}:
            touches.setdefault(v, []).append(i)
    folded: set[int] = set()
    for i, node in enumerate(g.nodes):
        if base_name(node.op) not in ("fill", "zero") or len(list(node.tensor_args())) != 1:
            continue
        (dst,) = node.tensor_args()
        if dst in base or dst in outputs or [v for v in node.written_values()] != [dst]:
            continue
        first, *readers = touches[dst]
        if first == i and readers and all(_reads_constant(g.nodes[n], dst, base) for n in readers):
            folded.add(i)
    return frozenset(folded)


def _reads_constant(node: Node, root: Value, base: dict[Value, Value]) -> bool:
    written = {base.get(v, v) for v in node.written_values()}
    return classify(node.op) in _READS_CONSTANTS and root not in written
