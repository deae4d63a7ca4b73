"""Trn1 and Trn2 as data: every figure the simulator and compiler price things with.

Values are from the Neuron SDK docs (docs/chip.md lists each with its source); [E] marks an
estimate that AWS does not publish. One simulated core = one physical NeuronCore.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class UnknownTargetError(ValueError):
    """Unrecoverable: the target name is not one of TARGETS."""


@dataclass(frozen=True)
class Target:
    name: str
    generation: str
    cores_per_chip: int
    # Engine clocks (GHz) -- Neuron SDK docs, architecture pages.
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    # Tensor engine: 128x128 systolic array; moving tile up to 512 columns; FP32 is 4x slower.
    pe_rows: int
    pe_cols: int
    moving_free_max: int
    fp32_matmul_factor: int
    # Vector engine elements per cycle per partition lane group: BF16/FP16 fast mode vs other.
    vector_fast_bf16: bool
    partitions: int
    min_ii_cycles: int  # minimum initiation interval of an engine instruction
    access_start_cycles: int  # ~60 cycles to start an SBUF/PSUM access
    gpsimd_fixed_cycles: int  # ~150 + N per GpSimd instruction
    # On-chip memories per core.
    sbuf_bytes: int
    psum_bytes: int
    # HBM per core (chip capacity and bandwidth divided by cores per chip).
    hbm_bytes: int
    hbm_gbps: float
    # DMA: engines per core, bandwidth each (bytes/ns = GB/s), fixed cost per transfer.
    dma_engines: int
    dma_gbps_per_engine: float
    dma_fixed_ns: float
    dma_efficiency_knee_bytes: int  # efficiency c / (c + knee) for c contiguous B/partition [E]
    host_link_gbps: float  # host <-> device
    # Launch and host-side runtime costs for the simulated timeline [E].
    launch_overhead_ns: int  # per-executable fixed device cost
    host_dispatch_op_ns: int  # dispatch one eager op on a native runtime
    host_record_op_ns: int  # record one op into a graph
    host_submit_ns: int  # submit one launch
    # Collectives (ring): fixed, per hop inside / between nodes, bus bandwidth inside a node.
    collective_alpha0_ns: int
    collective_hop_ns: int
    collective_hop_internode_ns: int
    collective_gbps: float
    collective_internode_gbps: float  # one core's EFA share at most
    collective_chunk_bytes: int  # the smallest chunk a tree pipelines its message in [E]
    # The instance: chips per host and the host's EFA bandwidth (GB/s), shared by its cores.
    chips_per_host: int
    efa_host_gbps: float
    # Published peak per core, for the cost model's own tests (TFLOPS).
    peak_bf16_tflops: float
    peak_fp32_tflops: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def cores_per_host(self) -> int:
        return self.chips_per_host * self.cores_per_chip

    @property
    def dma_gbps(self) -> float:
        """Aggregate DMA bandwidth of one core, capped by its share of HBM bandwidth."""
        return min(self.dma_engines * self.dma_gbps_per_engine, self.hbm_gbps)


TRN1 = Target(
    name="trn1",
    generation="NeuronCore-v2",
    cores_per_chip=2,
    tensor_ghz=2.8,
    vector_ghz=1.12,
    scalar_ghz=1.4,
    gpsimd_ghz=1.4,
    pe_rows=128,
    pe_cols=128,
    moving_free_max=512,
    fp32_matmul_factor=4,
    vector_fast_bf16=False,  # Trn1's Vector engine: 128 lanes, 1 element/lane/cycle
    partitions=128,
    min_ii_cycles=64,
    access_start_cycles=60,
    gpsimd_fixed_cycles=150,
    sbuf_bytes=24 * MiB,
    psum_bytes=2 * MiB,
    hbm_bytes=32 * GiB // 2,
    hbm_gbps=820.0 / 2,
    dma_engines=16,
    dma_gbps_per_engine=17.0,
    dma_fixed_ns=1300.0,
    dma_efficiency_knee_bytes=512,
    host_link_gbps=16.0,
    launch_overhead_ns=15_000,
    host_dispatch_op_ns=20_000,
    host_record_op_ns=1_500,
    host_submit_ns=20_000,
    collective_alpha0_ns=10_000,
    collective_hop_ns=1_500,
    collective_hop_internode_ns=15_000,
    collective_gbps=55.0,
    collective_internode_gbps=12.5,  # [E] 100 Gb/s EFA share per core
    collective_chunk_bytes=64 * KiB,
    chips_per_host=16,  # trn1.32xlarge
    efa_host_gbps=100.0,  # trn1.32xlarge: 800 Gb/s EFA
    peak_bf16_tflops=92.0,
    peak_fp32_tflops=23.0,
)

TRN2 = Target(
    name="trn2",
    generation="NeuronCore-v3",
    cores_per_chip=8,
    tensor_ghz=2.4,
    vector_ghz=0.96,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    pe_rows=128,
    pe_cols=128,
    moving_free_max=512,
    fp32_matmul_factor=4,
    vector_fast_bf16=True,  # 512 elements/cycle for BF16/FP16 in perf mode, 256 otherwise
    partitions=128,
    min_ii_cycles=64,
    access_start_cycles=60,
    gpsimd_fixed_cycles=150,
    sbuf_bytes=28 * MiB,
    psum_bytes=2 * MiB,
    hbm_bytes=96 * GiB // 8,
    hbm_gbps=2900.0 / 8,
    dma_engines=16,
    dma_gbps_per_engine=23.0,
    dma_fixed_ns=1300.0,
    dma_efficiency_knee_bytes=512,
    host_link_gbps=16.0,
    launch_overhead_ns=15_000,
    host_dispatch_op_ns=20_000,
    host_record_op_ns=1_500,
    host_submit_ns=20_000,
    collective_alpha0_ns=10_000,
    collective_hop_ns=1_500,
    collective_hop_internode_ns=15_000,
    collective_gbps=100.0,
    collective_internode_gbps=25.0,  # [E]
    collective_chunk_bytes=64 * KiB,
    chips_per_host=16,  # trn2.48xlarge
    efa_host_gbps=400.0,  # trn2.48xlarge: 3.2 Tb/s EFAv3
    peak_bf16_tflops=79.0,
    peak_fp32_tflops=20.0,
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2)}
DEFAULT_TARGET = "trn2"


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise UnknownTargetError(f"unknown target {name!r}; use one of: {known}") from None
