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


def host_transfer_ns(target: Target, nbytes: int) -> float:
    """Host <-> device copy over the host link (one transfer's fixed cost included)."""
    return target.dma_fixed_ns + nbytes / target.host_link_gbps


def launch_ns(target: Target) -> int:
    """Fixed device cost of running one executable."""
    return target.launch_overhead_ns


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def collective_ns(
    target: Target, kind: str, ranks: int, nbytes: int, inter_node: bool = False
) -> float:
    """Ring collective time: alpha0 + hops x alpha_hop + bytes moved / bus bandwidth."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; use one of {COLLECTIVES}")
    if ranks <= 1:
        return 0.0
    hop = target.collective_hop_internode_ns if inter_node else target.collective_hop_ns
    gbps = target.collective_internode_gbps if inter_node else target.collective_gbps
    steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
    moved = steps / ranks * nbytes
    return target.collective_alpha0_ns + steps * hop + moved / gbps
