"""Time to first training step of N ranks on one host, launched by the real torchrun.

    python benchmarks/ttfs.py [--ranks 1,2,4,8] [--scale 1.0] [--modes eager,adaptive]
                              [--model llama-3.2-1b [--layout fsdp]]

Each rank (benchmarks/ttfs_rank.py) trains a small Llama-style model to its first
optimizer.step() and loss.item(). With --model, each rank (benchmarks/scale_rank.py)
trains that full-size model of benchmarks/scale.py instead, shape-only
(NEURON_SIM_NUMERICS=off), laid out over the ranks with FSDP2 (or tensor parallelism). Per mode and N, four settings in turn:
- off:  a cold cache with the daemon off: every rank compiles everything for itself;
- cold: a cold cache through one daemon, auto-started by the ranks (its own socket and cache);
- warm: the same daemon again (a second launch): its cache holds every executable, and each
  rank reads its hits from the daemon's disk tier itself;
- warm, asked: a third launch with NEURON_COMPILE_DIRECT_READS=0: every hit is asked of the
  daemon over its stream (how warm starts went before direct reads).
Compiles burn `--scale` x their modelled time of CPU (NEURON_SIM_COMPILE_SCALE; 1.0: a
modelled second of compiling is a CPU second, as on the real compiler), where they happen:
in each rank, or in the daemon's workers. Printed per setting: wall time to first step
(launch to the slowest rank's first loss.item()), the compile part of it (the slowest
rank's wall time waiting in blocking compiles), the first step's wall time less a steady
step's (compiles and every other first-time cost), simulated time to first step and a
simulated step right after it, compiles made (the ranks' own, blocking and background, or
the daemon's `trnsim stats`), duplicate compiles avoided, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


RANK_SCRIPT: list[str] = [str(HERE / "ttfs_rank.py")]  # (--model: scale_rank.py and its args)


def launch(n: int, env: dict[str, str], out: Path) -> list[dict[str, float]]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**env, "TTFS_OUT": str(out), "TTFS_T0": repr(time.time())}
    script = [*RANK_SCRIPT, str(out)] if len(RANK_SCRIPT) > 1 else RANK_SCRIPT
    subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            f"--nproc_per_node={n}",
            *script,
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    failed = [r for r in ranks if "error" in r]
    if failed:
        raise SystemExit(f"rank {failed[0]['rank']} failed: {failed[0]['error']}")
    return ranks


def daemon_stats(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(
        [str(BIN / "trnsim"), "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def stop_daemon(env: dict[str, str]) -> None:
    subprocess.run(
        [str(BIN / "trnsim"), "daemon", "stop"], env=env, capture_output=True, check=False
    )


def asked(ranks: list[dict[str, float]]) -> int:
    """Compiles the ranks asked for: blocking ones on a miss in their own executable table,
    and background ones for adaptive mode's fused graphs (more are asked for when compiles
    go to a shared daemon: policy/compile_policy.py)."""
    return int(
        sum(
            r["executables_compiled"]
            + r.get("executables_fetched", 0)
            + r["fused_compiles_requested"]
            for r in ranks
        )
    )


def row(name: str, ranks: list[dict[str, float]], compiles: int) -> dict[str, float]:
    return {
        "setting": name,  # type: ignore[dict-item]
        "wall": max(r["ttfs_wall_s"] for r in ranks),
        "compile": max(r["compile_wait_wall_s"] for r in ranks),
        "first_extra": max(r["first_step_wall_s"] - r["steady_step_wall_s"] for r in ranks),
        "sim": max(r["ttfs_sim_s"] for r in ranks),
        "steady_sim_us": max(r["steady_step_sim_us"] for r in ranks),
        "compiles": compiles,
        "avoided": asked(ranks) - compiles,
    }


def settings(n: int, mode: str, scale: float, work: Path) -> list[dict[str, float]]:
    base = {
        **os.environ,
        "NEURON_EAGER": mode,
        "NEURON_SIM_COMPILE_SCALE": str(scale),
        "NEURON_SIM_COMPILE_CLOCK": "on",
        "OMP_NUM_THREADS": "1",
    }
    off = launch(n, {**base, "NEURON_COMPILE_DAEMON": "off"}, work / "off")
    rows = [row("daemon off, cold", off, asked(off))]
    runtime_dir = Path(tempfile.mkdtemp(prefix="ttfs-run-"))
    os.chmod(runtime_dir, 0o700)
    daemon_env = {
        **base,
        "NEURON_COMPILE_DAEMON": "auto",
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "NEURON_CACHE_DIR": str(work / "cache"),
    }
    try:
        cold = launch(n, daemon_env, work / "cold")
        made = daemon_stats(daemon_env)
        rows.append(row("daemon, cold cache", cold, int(made["compiles"])))
        warm = launch(n, daemon_env, work / "warm")
        after = daemon_stats(daemon_env)
        rows.append(row("daemon, warm", warm, int(after["compiles"]) - int(made["compiles"])))
        asked_env = {**daemon_env, "NEURON_COMPILE_DIRECT_READS": "0"}
        warm_asked = launch(n, asked_env, work / "warm-asked")
        last = daemon_stats(daemon_env)
        rows.append(
            row("daemon, warm, asked", warm_asked, int(last["compiles"]) - int(after["compiles"]))
        )
    finally:
        stop_daemon(daemon_env)
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4,8")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--modes", default="eager,adaptive")
    parser.add_argument(
        "--model", help="a full-size model of benchmarks/scale.py, shape-only (llama-3.2-1b)"
    )
    parser.add_argument("--layout", default="fsdp", help="with --model: fsdp or tp")
    parser.add_argument("--steps", type=int, default=3, help="with --model: steps per rank")
    args = parser.parse_args()
    if args.model:
        os.environ["NEURON_SIM_NUMERICS"] = "off"
        RANK_SCRIPT[:] = [
            str(HERE / "scale_rank.py"),
            args.model,
            args.layout,
            "env",
            str(args.steps),
        ]
    print(f"compile scale {args.scale} (CPU s per modelled compile s), {os.cpu_count()} CPUs")
    single: dict[str, float] = {}
    for mode in args.modes.split(","):
        for n in [int(x) for x in args.ranks.split(",")]:
            with tempfile.TemporaryDirectory(prefix="ttfs-") as tmp:
                rows = settings(n, mode, args.scale, Path(tmp))
            off, cold, warm, warm_asked = rows
            if n == 1:
                single[mode] = cold["wall"]
            print(f"\n{mode}, {n} rank(s)")
            print(
                f"{'setting':20} {'wall s':>8} {'compile s':>10} {'1st-steady s':>13} "
                f"{'sim s':>8} {'steady sim us':>14} {'compiles':>9} {'avoided':>8}"
            )
            for r in rows:
                print(
                    f"{r['setting']:20} {r['wall']:8.2f} {r['compile']:10.2f} "
                    f"{r['first_extra']:13.2f} {r['sim']:8.2f} {r['steady_sim_us']:14.1f} "
                    f"{r['compiles']:9d} {r['avoided']:8d}"
                )
            ratios = [
                f"cold daemon / daemon off {cold['wall'] / off['wall']:.2f}",
                f"warm / cold compile part {warm['compile'] / cold['compile']:.3f}",
                f"asked of the daemon {warm_asked['compile'] / cold['compile']:.3f}",
            ]
            if mode in single:
                ratios.append(f"cold daemon / 1 rank's {cold['wall'] / single[mode]:.2f}")
            print("wall: " + ", ".join(ratios))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
