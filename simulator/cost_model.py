"""Time of every instruction class on one core, from the target table (Neuron SDK docs).

Every function returns a Cost: the engine that does the work, its cycles, its time in ns
and the time until its first tile is ready (what a streaming consumer waits for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnsim.simulator.config import Target

TILE_ELEMENTS_PER_PARTITION = 2048  # free size of one SBUF tile an engine instruction processes


@dataclass(frozen=True)
class Cost:
    engine: str  # "tensor" | "vector" | "scalar" | "gpsimd" | "dma" | "none"
    cycles: int
    ns: float
    first_tile_ns: float
    tiles: int = 1

    @staticmethod
    def zero(engine: str = "none") -> Cost:
        return Cost(engine, 0, 0.0, 0.0, 0)


def _ns(cycles: float, ghz: float) -> float:
    return cycles / ghz


def _per_partition(elements: int, partitions: int) -> int:
    # Using fewer than 128 partitions costs the same as using all of them.
    return max(1, -(-elements // partitions))


def _tiled(elements: int, target: Target) -> tuple[int, int, int]:
    """(tiles, elements per partition in a full tile, in the last tile)."""
    n = _per_partition(elements, target.partitions)
    tiles = max(1, -(-n // TILE_ELEMENTS_PER_PARTITION))
    last = n - (tiles - 1) * TILE_ELEMENTS_PER_PARTITION
    return tiles, min(n, TILE_ELEMENTS_PER_PARTITION), last


def _engine_cost(
    engine: str, ghz: float, elements: int, target: Target, per_elem: float, floor: int, fixed: int
) -> Cost:
    tiles, full, last = _tiled(elements, target)

    def tile_cycles(n: int) -> float:
        return fixed + max(floor, per_elem * n) + target.access_start_cycles

    cycles = (tiles - 1) * tile_cycles(full) + tile_cycles(last)
    first = tile_cycles(full if tiles > 1 else last)
    return Cost(engine, math.ceil(cycles), _ns(cycles, ghz), _ns(first, ghz), tiles)


def matmul(target: Target, m: int, k: int, n: int, low_precision: bool, batch: int = 1) -> Cost:
    """C[m,n] = A[m,k] @ B[k,n] on the Tensor engine, tiled to 128x128 stationary, 512 moving.

    Per instruction: max(min(64, n_stationary), n_moving) cycles, x4 for FP32.
    """
    if min(m, k, n, batch) <= 0:
        return Cost.zero("tensor")
    k_tiles = -(-k // target.pe_rows)
    m_tiles = -(-m // target.pe_cols)
    n_full, n_rest = divmod(n, target.moving_free_max)

    def m_tile_cycles(stationary: int) -> int:
        cycles = n_full * max(min(64, stationary), target.moving_free_max)
        if n_rest:
            cycles += max(min(64, stationary), n_rest)
        return cycles

    # Every m tile but the last is full: closed form, whatever the size (no loop over tiles).
    last = m - (m_tiles - 1) * target.pe_cols
    all_m_tiles = (m_tiles - 1) * m_tile_cycles(target.pe_cols) + m_tile_cycles(last)
    first_m_tile = m_tile_cycles(min(target.pe_cols, m))
    factor = 1 if low_precision else target.fp32_matmul_factor
    total = batch * k_tiles * all_m_tiles * factor
    first = (first_m_tile // max(1, n_full + (1 if n_rest else 0))) * k_tiles * factor
    return Cost(
        "tensor",
        total,
        _ns(total, target.tensor_ghz),
        _ns(first, target.tensor_ghz),
        batch * m_tiles * max(1, n_full + (1 if n_rest else 0)),
    )


def transpose(target: Target, rows: int, cols: int) -> Cost:
    """Transpose through the Tensor engine: max(P, min(64, F)) cycles per 128x128 block."""
    blocks_r = -(-rows // target.partitions)
    blocks_c = -(-cols // target.partitions)
    per_block = max(target.partitions, min(64, cols))
    total = blocks_r * blocks_c * per_block
    return Cost("tensor", total, _ns(total, target.tensor_ghz), _ns(per_block, target.tensor_ghz))


def tensor_tensor(target: Target, elements: int, low_precision: bool) -> Cost:
    """Elementwise op of two tensors on the Vector engine: 2N cycles (N for BF16 fast mode)."""
    fast = low_precision and target.vector_fast_bf16
    return _engine_cost(
        "vector", target.vector_ghz, elements, target, 1.0 if fast else 2.0, target.min_ii_cycles, 0
    )


def tensor_scalar(target: Target, elements: int) -> Cost:
    """Tensor op scalar (or a copy) on the Vector engine: max(MIN_II, N)."""
    return _engine_cost("vector", target.vector_ghz, elements, target, 1.0, target.min_ii_cycles, 0)


def activation(target: Target, elements: int) -> Cost:
    """Activation function with fused scale/bias on the Scalar engine: max(MIN_II, N)."""
    return _engine_cost("scalar", target.scalar_ghz, elements, target, 1.0, target.min_ii_cycles, 0)


def reduction(target: Target, elements: int, low_precision: bool) -> Cost:
    """Reduction along the free dimension on the Vector engine: N (N/2 for BF16 add/max)."""
    per = 0.5 if low_precision else 1.0
    return _engine_cost("vector", target.vector_ghz, elements, target, per, target.min_ii_cycles, 0)


def normalization(target: Target, elements: int) -> Cost:
    """Mean/variance (bn_stats + bn_aggr, 13N/3) then a scale-shift pass (N) on Vector."""
    return _engine_cost(
        "vector", target.vector_ghz, elements, target, 13 / 3 + 1, target.min_ii_cycles, 0
    )


def reciprocal(target: Target, elements: int) -> Cost:
    return _engine_cost("vector", target.vector_ghz, elements, target, 8.0, target.min_ii_cycles, 0)


def gpsimd(target: Target, elements: int) -> Cost:
    """GpSimd instruction: ~150 + N cycles (gather, scatter, iota, masks, RNG, sort)."""
    return _engine_cost(
        "gpsimd", target.gpsimd_ghz, elements, target, 1.0, 0, target.gpsimd_fixed_cycles
    )


def dma_efficiency(target: Target, contiguous_bytes: int) -> float:
    """Share of peak bandwidth reached with c contiguous bytes per partition [E]."""
    c = max(1, contiguous_bytes)
    return c / (c + target.dma_efficiency_knee_bytes)


def dma(
    target: Target, nbytes: int, contiguous_bytes: int | None = None, queues: int | None = None
) -> Cost:
    """One transfer: t0 + bytes / (bandwidth x efficiency), spread over the DMA queues.

    contiguous_bytes is the run length per partition (default: the transfer spread evenly
    over 128 partitions); queues is how many of the core's DMA engines share the transfer.
    """
    if nbytes <= 0:
        return Cost.zero("dma")
    if contiguous_bytes is None:
        contiguous_bytes = -(-nbytes // target.partitions)
    queues = target.dma_engines if queues is None else max(1, min(queues, target.dma_engines))
    gbps = min(queues * target.dma_gbps_per_engine, target.hbm_gbps)
    transfer = nbytes / (gbps * dma_efficiency(target, contiguous_bytes))
    ns = target.dma_fixed_ns + transfer
    tiles = max(1, -(-nbytes // (TILE_ELEMENTS_PER_PARTITION * target.partitions * 4)))
    first = target.dma_fixed_ns + transfer / tiles
    return Cost("dma", math.ceil(ns), ns, first, tiles)


@dataclass(frozen=True)
class SparseCost:
    """One sparse op: its time, and each engine's busy time in it."""

    ns: float
    engine_ns: dict[str, int]


# An indirect DMA moves one descriptor per gathered or scattered row [E]: the DMA engines
# process a descriptor in about this many ns beyond its bytes.
SPARSE_DESCRIPTOR_NS = 2.0


def sparse_op(
    target: Target,
    nnz: int,
    row_elements: int,
    itemsize: int,
    dense_bytes: int,
    sort: bool = False,
) -> SparseCost:
    """A sparse op over `nnz` nonzeros of `row_elements` elements each (1 for a plain COO or
    CSR tensor, the dense part or block otherwise), reading and writing `dense_bytes` of
    strided tensors.

    The nonzeros are gathered or scattered by indirect DMA: one descriptor per nonzero row,
    whose contiguous run is the row (short rows reach a small share of the bandwidth, by the
    DMA efficiency knee); their indices are computed on GpSimd (one element per nonzero,
    ~150 + N cycles per instruction), and the values combined on the Vector engine (2
    cycles per element). `sort`: the op coalesces, a sort of the nonzeros by index on GpSimd
    (N log2 N). Strided operands move by plain DMA. The engines overlap; the op takes the
    longest of them."""
    row_bytes = max(1, row_elements * itemsize)
    gathered = dma(target, nnz * row_bytes, contiguous_bytes=row_bytes)
    descriptors = nnz * SPARSE_DESCRIPTOR_NS / target.dma_engines
    plain = dma(target, dense_bytes)
    index_elements = nnz * (max(1, math.ceil(math.log2(nnz))) if sort and nnz > 1 else 1)
    index_work = gpsimd(target, index_elements) if nnz else Cost.zero("gpsimd")
    values = tensor_tensor(target, nnz * row_elements, low_precision=False)
    dma_ns = gathered.ns + descriptors + plain.ns
    engine_ns = {"dma": math.ceil(dma_ns), "gpsimd": math.ceil(index_work.ns)}
    if nnz:
        engine_ns["vector"] = math.ceil(values.ns)
    return SparseCost(max(engine_ns.values()), engine_ns)


def host_transfer_ns(target: Target, nbytes: int) -> float:
    """Host <-> device copy over the host link (one transfer's fixed cost included)."""
    return target.dma_fixed_ns + nbytes / target.host_link_gbps


def launch_ns(target: Target) -> int:
    """Fixed device cost of running one executable."""
    return target.launch_overhead_ns


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")


@dataclass(frozen=True)
class Topology:
    """Where a group's ranks are: how many, on how many hosts, and the most on one host."""

    ranks: int
    hosts: int = 1
    local: int = 0  # ranks on the fullest host (0: ranks / hosts, rounded up)

    @property
    def per_host(self) -> int:
        return self.local or -(-self.ranks // self.hosts)

    @staticmethod
    def of(host_of_rank: list[str] | list[int]) -> Topology:
        """The topology of a group from each rank's host (any hashable names)."""
        counts: dict[object, int] = {}
        for h in host_of_rank:
            counts[h] = counts.get(h, 0) + 1
        return Topology(len(host_of_rank), len(counts), max(counts.values(), default=0))


@dataclass(frozen=True)
class CollectiveCost:
    ns: float
    algorithm: str  # "ring" | "tree" | "hierarchical" | "pairwise" | "none"
    link: str  # "neuronlink" | "efa" | "none"
    gbps: float  # bandwidth of the slowest link the data crosses (per rank)


def _ring(steps: int, moved: float, hop_ns: float, gbps: float, alpha0: float) -> float:
    return alpha0 + steps * hop_ns + moved / gbps


def _tree(depth: int, nbytes: int, hop_ns: float, gbps: float, alpha0: float, chunk: int) -> float:
    """A pipelined tree of `depth` levels: the message goes in k chunks, each chunk step a hop
    plus the chunk sent to two children (or received from two). k is the best for the
    message (a larger k pays more hops, a smaller one waits longer to fill the pipeline),
    with chunks no smaller than `chunk` bytes."""
    step = 2 * nbytes / gbps  # the whole message through one node's two links
    best = math.sqrt(max(depth - 1, 0) * step / hop_ns) if hop_ns > 0 else 1.0
    chunks = max(1, min(round(best), nbytes // chunk))
    return alpha0 + (depth + chunks - 1) * (hop_ns + step / chunks)


def _flat(
    target: Target, kind: str, n: int, nbytes: int, efa: bool, gbps: float
) -> tuple[float, str]:
    """One level: the ring (and, for all-reduce and broadcast, the tree when it is faster:
    latency-bound messages at many ranks), over links of `gbps` per rank."""
    hop = target.collective_hop_internode_ns if efa else target.collective_hop_ns
    a0 = target.collective_alpha0_ns
    if n <= 1:
        return 0.0, "none"
    if kind == "all_reduce":
        ring = _ring(2 * (n - 1), 2 * (n - 1) / n * nbytes, hop, gbps, a0)
        depth = 2 * math.ceil(math.log2(n))  # reduce up, broadcast down
        tree = _tree(depth, nbytes, hop, gbps, a0, target.collective_chunk_bytes)
        return (ring, "ring") if ring <= tree else (tree, "tree")
    if kind in ("all_gather", "reduce_scatter"):
        return _ring(n - 1, (n - 1) / n * nbytes, hop, gbps, a0), "ring"
    if kind == "broadcast":
        chain = _ring(n - 1, nbytes, hop, gbps, a0)  # a pipelined chain
        tree = _tree(math.ceil(math.log2(n)), nbytes, hop, gbps, a0, target.collective_chunk_bytes)
        return (chain, "ring") if chain <= tree else (tree, "tree")
    if kind == "all_to_all":
        return _ring(n - 1, (n - 1) / n * nbytes, hop, gbps, a0), "pairwise"
    # send: one hop
    return a0 + hop + nbytes / gbps, "pairwise"


def collective_cost(target: Target, kind: str, nbytes: int, topology: Topology) -> CollectiveCost:
    """Time of one collective over a group. nbytes is the buffer one rank holds for
    all-reduce and broadcast, the whole gathered (or to-be-scattered) buffer for all-gather
    and reduce-scatter, one rank's send buffer for all-to-all, the message for send.

    Inside one host the ranks form a ring over NeuronLink (or a tree, when faster). Across
    hosts the work is hierarchical: the ranks with the same local index form rails that
    cross hosts over EFA (a host's EFA bandwidth shared by its ranks), and each host's ranks
    finish over NeuronLink: all-reduce = reduce-scatter inside + all-reduce across (1/L of
    the data) + all-gather inside."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; use one of {COLLECTIVES}")
    n, hosts = topology.ranks, topology.hosts
    if n <= 1:
        return CollectiveCost(0.0, "none", "none", 0.0)
    nl = target.collective_gbps
    if hosts <= 1:
        ns, algorithm = _flat(target, kind, n, nbytes, False, nl)
        return CollectiveCost(ns, algorithm, "neuronlink", nl)
    local = topology.per_host
    efa = min(target.collective_internode_gbps, target.efa_host_gbps / local)
    if kind == "send" or local <= 1:
        ns, algorithm = _flat(target, kind, n, nbytes, True, efa)
        return CollectiveCost(ns, algorithm, "efa", efa)
    if kind == "all_to_all":  # each rank's data: (L-1)/N over NeuronLink, (N-L)/N over EFA
        inside, _ = _flat(target, kind, local, nbytes * local // n, False, nl)
        across = _ring(
            n - local, (n - local) / n * nbytes, target.collective_hop_internode_ns, efa, 0
        )
        return CollectiveCost(inside + across, "pairwise", "efa", efa)
    if kind == "broadcast":
        across, _ = _flat(target, kind, hosts, nbytes, True, efa)
        inside, _ = _flat(target, kind, local, nbytes, False, nl)
        return CollectiveCost(across + inside, "hierarchical", "efa", efa)
    inside, _ = _flat(target, "all_gather", local, nbytes, False, nl)
    if kind == "all_reduce":
        across, _ = _flat(target, "all_reduce", hosts, nbytes // local, True, efa)
        return CollectiveCost(2 * inside + across, "hierarchical", "efa", efa)
    across, _ = _flat(target, kind, hosts, nbytes // local, True, efa)
    return CollectiveCost(inside + across, "hierarchical", "efa", efa)


def collective_ns(
    target: Target, kind: str, ranks: int, nbytes: int, inter_node: bool = False
) -> float:
    """Time of a collective over `ranks` ranks, all on one host or each on its own."""
    topology = Topology(ranks, ranks if inter_node else 1)
    return collective_cost(target, kind, nbytes, topology).ns


def bus_gbps(kind: str, nbytes: int, ranks: int, ns: float) -> float:
    """The bus bandwidth a collective's time implies (nccl-tests' definition): the algorithm
    bandwidth nbytes / time, times the share of the data each rank must move."""
    if ns <= 0 or ranks <= 1:
        return 0.0
    factor = {"all_reduce": 2 * (ranks - 1) / ranks, "broadcast": 1.0, "send": 1.0}.get(
        kind, (ranks - 1) / ranks
    )
    return nbytes / ns * factor
