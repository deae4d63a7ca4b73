"""Trains one zoo model on neuron in one mode and prints, per step, the executables compiled and
the simulated time (with the compile waits on the clock); then one JSON line with the same.

    .venv/bin/python tests/zoo/compiles_per_step.py NAME [--mode eager|adaptive] [--steps 6]

NEURON_SHAPE_BUCKETS=exact compares against every size compiling on its own (eager ops whose
sizes change with the data otherwise run in shape buckets: client/door/buckets.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch
from models import ZOO
from neuron_helpers import quiet_transformers, use_in_process_compiles, wait_for_fused_compiles
from training import LR, MOMENTUM, seed_everything, to_device


def steps(name: str, mode: str, n: int) -> list[dict[str, float]]:
    """Per step: executables compiled, simulated ms, of which waiting for compiles."""
    case = ZOO[name]
    model, batch = case.build_model(), case.build_batch()
    torch.neuron.set_eager_mode(mode)
    seed_everything()
    model = model.to("neuron").train(case.train_mode)
    inputs = to_device(batch, "neuron")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    rows = []
    before = torch.neuron.metrics()
    for _ in range(n):
        loss = model(**inputs)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if mode == "adaptive":
            wait_for_fused_compiles()
        now = torch.neuron.metrics()
        rows.append(
            {
                "compiled": now["executables_compiled"] - before["executables_compiled"],
                "simulated_ms": (now["wall_ns"] - before["wall_ns"]) / 1e6,
                "compile_wait_ms": (now["compile_wait_ns"] - before["compile_wait_ns"]) / 1e6,
                "bucketed": now["op_bucket_signatures"] - before["op_bucket_signatures"],
            }
        )
        before = now
    return rows


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(ZOO), metavar="NAME", help="a zoo model")
    parser.add_argument("--mode", choices=("eager", "adaptive"), default="eager")
    parser.add_argument("--steps", type=int, default=6, help="training steps")
    args = parser.parse_args(argv)
    use_in_process_compiles()
    quiet_transformers()
    rows = steps(args.name, args.mode, args.steps)
    for i, r in enumerate(rows):
        print(
            f"step {i}: {r['compiled']} compiled, {r['simulated_ms']:.2f} simulated ms "
            f"({r['compile_wait_ms']:.2f} waiting for compiles), {r['bucketed']} signatures "
            "run in shape buckets"
        )
    print(json.dumps({"name": args.name, "mode": args.mode, "steps": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
