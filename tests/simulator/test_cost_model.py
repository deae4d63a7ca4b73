"""The cost model against the published figures it is built from."""

from __future__ import annotations

import pytest
from trnsim.simulator import cost_model
from trnsim.simulator.config import TARGETS, TRN1, TRN2, get_target


@pytest.mark.parametrize("target", [TRN1, TRN2], ids=lambda t: t.name)
@pytest.mark.parametrize("low_precision", [True, False], ids=["bf16", "fp32"])
def test_large_gemm_runs_within_10_percent_of_peak(target, low_precision):
    m = k = n = 4096
    cost = cost_model.matmul(target, m, k, n, low_precision)
    tflops = 2 * m * k * n / cost.ns / 1000
    peak = target.peak_bf16_tflops if low_precision else target.peak_fp32_tflops
    assert 0.9 * peak <= tflops <= 1.1 * peak, f"{tflops:.1f} TFLOPS vs peak {peak}"


def test_small_gemm_is_far_from_peak():
    cost = cost_model.matmul(TRN2, 8, 8, 8, True)
    assert 2 * 8**3 / cost.ns / 1000 < 0.01 * TRN2.peak_bf16_tflops


def test_fp32_matmul_is_four_times_slower():
    bf16 = cost_model.matmul(TRN2, 512, 512, 512, True)
    fp32 = cost_model.matmul(TRN2, 512, 512, 512, False)
    assert fp32.cycles == 4 * bf16.cycles


def test_small_dma_is_dominated_by_its_fixed_cost():
    cost = cost_model.dma(TRN2, 4096)
    assert cost.ns >= TRN2.dma_fixed_ns
    assert TRN2.dma_fixed_ns / cost.ns > 0.8, "4 KiB: most of the time is the fixed cost"


def test_large_dma_approaches_bandwidth():
    nbytes = 256 * 1024 * 1024
    cost = cost_model.dma(TRN2, nbytes)
    achieved = nbytes / cost.ns  # bytes/ns = GB/s
    assert 0.9 * TRN2.dma_gbps <= achieved <= TRN2.dma_gbps


def test_dma_efficiency_curve():
    eff = [cost_model.dma_efficiency(TRN2, c) for c in (64, 256, 2048, 4096, 65536)]
    assert eff == sorted(eff)
    assert eff[1] < 0.5, "below 256 B/partition is badly overhead-bound"
    assert eff[3] >= 0.88, "4 KiB per partition nearly saturates"
    strided = cost_model.dma(TRN2, 1 << 20, contiguous_bytes=64)
    assert strided.ns > 3 * cost_model.dma(TRN2, 1 << 20).ns


def test_elementwise_engines_and_floors():
    tiny = cost_model.tensor_tensor(TRN2, 128, low_precision=False)
    assert tiny.engine == "vector"
    assert tiny.cycles == TRN2.min_ii_cycles + TRN2.access_start_cycles, "MIN_II floor"
    n = 128 * 1024
    fp32 = cost_model.tensor_tensor(TRN2, 128 * n, low_precision=False)
    bf16 = cost_model.tensor_tensor(TRN2, 128 * n, low_precision=True)
    assert fp32.cycles == pytest.approx(2 * bf16.cycles, rel=0.03)
    assert cost_model.activation(TRN2, 1 << 20).engine == "scalar"
    assert cost_model.gpsimd(TRN2, 128).cycles >= TRN2.gpsimd_fixed_cycles
    assert (
        cost_model.reciprocal(TRN2, 1 << 20).cycles
        > 7 * cost_model.tensor_scalar(TRN2, 1 << 20).cycles
    )


def test_elementwise_time_grows_linearly():
    a = cost_model.tensor_scalar(TRN1, 128 * 100_000)
    b = cost_model.tensor_scalar(TRN1, 128 * 200_000)
    assert b.ns == pytest.approx(2 * a.ns, rel=0.02)
    assert a.tiles > 1 and a.first_tile_ns < a.ns


def test_transpose_on_tensor_engine():
    cost = cost_model.transpose(TRN2, 256, 256)
    assert cost.engine == "tensor" and cost.cycles == 4 * 128


def test_collectives_match_published_all_reduce():
    # A published 2-rank all-reduce on Trn1: 18.9 ms at 1 GiB.
    ns = cost_model.collective_ns(TRN1, "all_reduce", 2, 1 << 30)
    assert ns / 1e6 == pytest.approx(18.9, rel=0.1)
    small = cost_model.collective_ns(TRN1, "all_reduce", 2, 1024)
    assert small == pytest.approx(TRN1.collective_alpha0_ns + 2 * TRN1.collective_hop_ns, rel=0.01)
    assert cost_model.collective_ns(TRN2, "all_gather", 1, 1 << 20) == 0.0
    inter = cost_model.collective_ns(TRN2, "all_gather", 8, 1 << 20, inter_node=True)
    assert inter > cost_model.collective_ns(TRN2, "all_gather", 8, 1 << 20)
    with pytest.raises(ValueError, match="unknown collective"):
        cost_model.collective_ns(TRN2, "gossip", 2, 1)


def test_launch_and_host_transfer():
    assert cost_model.launch_ns(TRN2) == 15_000
    assert cost_model.host_transfer_ns(TRN2, 16_000) == pytest.approx(TRN2.dma_fixed_ns + 1000)


def test_targets_table():
    assert set(TARGETS) == {"trn1", "trn2"}
    for t in TARGETS.values():
        per_core = t.pe_rows * t.pe_cols * 2 * t.tensor_ghz / 1000
        assert per_core == pytest.approx(t.peak_bf16_tflops, rel=0.01)
    with pytest.raises(ValueError, match="trn1, trn2"):
        get_target("trn3")


def test_ring_all_reduce_is_the_published_formula_inside_a_host():
    n, size = 8, 256 << 20
    cost = cost_model.collective_cost(TRN2, "all_reduce", size, cost_model.Topology(n))
    hop, beta = TRN2.collective_hop_ns, TRN2.collective_gbps
    assert cost.algorithm == "ring" and cost.link == "neuronlink"
    assert cost.ns == pytest.approx(
        TRN2.collective_alpha0_ns + 2 * (n - 1) * hop + 2 * (n - 1) / n * size / beta
    )
    # The bus bandwidth a large all-reduce implies approaches the link's.
    bus = cost_model.bus_gbps("all_reduce", size, n, cost.ns)
    assert 0.95 * beta < bus < beta
    gather = cost_model.collective_cost(TRN2, "all_gather", size, cost_model.Topology(n))
    assert gather.ns == pytest.approx(
        TRN2.collective_alpha0_ns + (n - 1) * hop + (n - 1) / n * size / beta
    )


def test_small_messages_at_many_ranks_take_the_tree():
    small = cost_model.collective_cost(TRN2, "all_reduce", 1024, cost_model.Topology(64))
    assert small.algorithm == "tree"
    ring = TRN2.collective_alpha0_ns + 2 * 63 * TRN2.collective_hop_ns
    assert small.ns < ring
    large = cost_model.collective_cost(TRN2, "all_reduce", 256 << 20, cost_model.Topology(64))
    assert large.algorithm == "ring"


def test_across_hosts_the_all_reduce_is_hierarchical_over_efa():
    topo = cost_model.Topology(64, hosts=2)
    size = 64 << 20
    cost = cost_model.collective_cost(TRN2, "all_reduce", size, topo)
    assert (cost.algorithm, cost.link) == ("hierarchical", "efa")
    efa = min(TRN2.collective_internode_gbps, TRN2.efa_host_gbps / 32)
    assert cost.gbps == efa
    inside = cost_model.collective_cost(TRN2, "all_gather", size, cost_model.Topology(32)).ns
    # the rails: 32 ring all-reduces of 1/32 of the data between the 2 hosts, at once
    hop = TRN2.collective_hop_internode_ns
    across = TRN2.collective_alpha0_ns + 2 * hop + (size // 32) / efa
    assert cost.ns == pytest.approx(2 * inside + across)
    assert (
        cost.ns > cost_model.collective_cost(TRN2, "all_reduce", size, cost_model.Topology(64)).ns
    )
    assert cost_model.Topology.of(["a", "a", "b"]) == cost_model.Topology(3, 2, 2)


def test_sparse_ops_grow_with_the_nonzeros_and_short_rows_waste_bandwidth():
    """Indirect DMA over the nonzeros: time grows with nnz; per byte moved, 1-element rows
    (plain COO) cost more than 64-element rows (embedding rows), by the DMA efficiency knee;
    a coalesce adds a sort on GpSimd."""
    small = cost_model.sparse_op(TRN2, nnz=1_000, row_elements=1, itemsize=4, dense_bytes=0)
    large = cost_model.sparse_op(TRN2, nnz=100_000, row_elements=1, itemsize=4, dense_bytes=0)
    assert large.ns > 10 * small.ns
    rows = cost_model.sparse_op(TRN2, nnz=100_000, row_elements=64, itemsize=4, dense_bytes=0)
    assert rows.ns / (64 * 100_000) < large.ns / 100_000
    sorted_ = cost_model.sparse_op(
        TRN2, nnz=100_000, row_elements=1, itemsize=4, dense_bytes=0, sort=True
    )
    assert sorted_.engine_ns["gpsimd"] > large.engine_ns["gpsimd"]
    assert sorted_.ns == max(sorted_.engine_ns.values())
    empty = cost_model.sparse_op(TRN2, nnz=0, row_elements=1, itemsize=4, dense_bytes=0)
    assert empty.ns == 0
