"""Modelled all-reduce time against message size and rank count, and the bus bandwidth it
implies next to the link's figure (simulator/cost_model.py; deterministic, no ranks run).

    python benchmarks/collectives.py [--target trn2] [--kind all_reduce]

One host: the ranks' NeuronCores on one instance (NeuronLink). Across hosts: the same ranks
spread over instances of `cores_per_host` cores (EFA between them, NeuronLink inside).
Bus bandwidth is nccl-tests' definition: size / time x 2(n-1)/n for all-reduce. The letter
after each cell is the algorithm the model chose: r(ing), t(ree), h(ierarchical); the last
row is the slowest link the data crosses and its bandwidth per rank.
"""

from __future__ import annotations

import argparse

from trnsim.simulator import cost_model
from trnsim.simulator.config import TARGETS, get_target

SIZES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 16 << 20, 256 << 20]
RANKS = [2, 4, 8, 32, 64]


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def table(target_name: str, kind: str, hosts_of: dict[int, int], title: str) -> None:
    target = get_target(target_name)
    print(f"\n{title}")
    head = " | ".join(f"{f'{n} ranks':>22}" for n in RANKS)
    print(f"{'size':>8} | {head}")
    print("-" * (11 + 25 * len(RANKS)))
    for size in SIZES:
        cells = []
        for n in RANKS:
            topology = cost_model.Topology(n, hosts_of[n])
            cost = cost_model.collective_cost(target, kind, size, topology)
            bus = cost_model.bus_gbps(kind, size, n, cost.ns)
            cells.append(f"{cost.ns / 1e3:>8.1f} us {bus:>5.1f} GB/s {cost.algorithm[0]}")
        print(f"{_size(size):>8} | " + " | ".join(f"{c:>22}" for c in cells))
    links = {  # the algorithm and the slowest link of the largest message
        n: cost_model.collective_cost(target, kind, SIZES[-1], cost_model.Topology(n, hosts_of[n]))
        for n in RANKS
    }
    print(
        f"{'links':>8} | "
        + " | ".join(f"{f'{c.link} {c.gbps:g} GB/s':>22}" for c in links.values())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="trn2", choices=sorted(TARGETS))
    parser.add_argument("--kind", default="all_reduce", choices=cost_model.COLLECTIVES)
    args = parser.parse_args()
    target = get_target(args.target)
    per_host = target.cores_per_host
    print(
        f"modelled {args.kind} on {target.name}: NeuronLink {target.collective_gbps:g} GB/s per "
        f"rank, EFA {target.efa_host_gbps:g} GB/s per host (at most "
        f"{target.collective_internode_gbps:g} per rank), {per_host} cores per host; "
        f"time (us) and bus bandwidth (GB/s)"
    )
    one_host = {n: 1 for n in RANKS}
    table(args.target, args.kind, one_host, "all ranks on one host (NeuronLink):")
    two = {n: 2 for n in RANKS}
    table(args.target, args.kind, two, "the ranks split over two hosts (EFA between them):")
    per_rank = {n: n for n in RANKS}
    table(args.target, args.kind, per_rank, "one rank per host (EFA only):")


if __name__ == "__main__":
    main()
