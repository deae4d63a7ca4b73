"""Host microseconds per op, neuron eager vs CPU eager, measured side by side in one run.

    python benchmarks/dispatch.py [--repeat 15] [--number 2000]

Each case runs alternately on both devices; the median of `repeat` timings of `number`
calls is reported, with the ratio neuron / CPU. Warm: every executable is already cached.
With the C++ door (client/door/fast.py) built, the same calls through the Python door alone
are timed in turn too (the column "python door").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from trnsim.client.door import fast


def _time(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number * 1e6


def cases(device: str) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(0)
    a16 = torch.randn(16, generator=g).to(device)
    b16 = torch.randn(16, generator=g).to(device)
    a64 = torch.randn(64, 64, generator=g).to(device)
    b64 = torch.randn(64, 64, generator=g).to(device)
    w = torch.randn(64, 64, generator=g).to(device)
    x = torch.randn(32, 256, generator=g).to(device)
    ln = torch.nn.LayerNorm(256).to(device)
    return {
        "add (16,)": lambda: torch.add(a16, b16),
        "add (64,64)": lambda: torch.add(a64, b64),
        "mul_ (64,64)": lambda: a64.mul_(1.0),
        "relu (64,64)": lambda: torch.relu(a64),
        "matmul (64,64)@(64,64)": lambda: a64 @ w,
        "layer_norm (32,256)": lambda: ln(x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    cpu, neuron = cases("cpu"), cases("neuron")
    with torch.no_grad():
        for fn in neuron.values():  # compile everything first: measure the warm path
            fn()
        torch.neuron.synchronize()
        both = fast.module() is not None
        print(
            f"{'op':<26} {'cpu us':>8} {'neuron us':>10} {'ratio':>7}"
            + (f" {'python door us':>15} {'ratio':>7}" if both else "")
        )
        for name in cpu:
            c, n, p = [], [], []
            for _ in range(args.repeat):
                c.append(_time(cpu[name], args.number))
                n.append(_time(neuron[name], args.number))
                if both:
                    with fast.python_door_only():
                        p.append(_time(neuron[name], args.number))
            mc, mn = statistics.median(c), statistics.median(n)
            line = f"{name:<26} {mc:>8.2f} {mn:>10.2f} {mn / mc:>6.1f}x"
            if both:
                mp = statistics.median(p)
                line += f" {mp:>15.2f} {mp / mc:>6.1f}x"
            print(line)
    m = torch.neuron.metrics()
    print(
        f"compiled during timing: {m['executables_compiled']} executables in all (warm-up included)"
    )


if __name__ == "__main__":
    main()
