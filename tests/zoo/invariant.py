"""Shape-only mode is faithful: for every zoo model, in eager, adaptive and compiled mode, a
training step with numerics off (NEURON_SIM_NUMERICS=off) gives the same simulated step
time, launches, executables and HBM peak as the same step with numerics on.

    .venv/bin/python tests/zoo/invariant.py [NAME ...] [--jobs 2] [--timeout 400]

Each model runs twice, in two processes (numerics on, numerics off); each process trains
STEPS steps of SGD in each neuron mode on a fresh runtime and prints what the simulator
measured. A model whose data-dependent shapes were taken by assumption (MoE routing,
nonzero) is reported as "assumed" with the assumptions, not compared: its numerics-on run
had other shapes. Exit status 0 when every other model matches in every mode.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from models import ZOO
from pool import JOBS, died, exit_reason, last_json, worker_env
from table import table

MODES = ("eager", "adaptive", "compiled")
STEPS = 3
TIMEOUT_S = 400.0
# What must be identical with numerics on and off.
MEASURES = (
    "last_step_ns",
    "wall_ns",
    "launches",
    "executables",
    "hbm_peak",
    "hbm_bytes",
    "device_busy_ns",
)


def measure(name: str, mode: str) -> dict[str, Any]:
    """STEPS training steps of one model in one mode on a fresh runtime: the simulator's
    measures (the executables as a digest of their cache keys)."""
    import torch
    from neuron_helpers import fresh_runtime, wait_for_fused_compiles
    from training import LR, seed_everything, to_device
    from trnsim.client.api import explain
    from trnsim.client.core import runtime

    case = ZOO[name]
    fresh_runtime()
    explain.reset()
    torch.neuron.set_eager_mode("eager" if mode == "compiled" else mode)
    seed_everything()
    model = case.build_model().to("neuron")
    batch = to_device(case.build_batch(), "neuron")
    model.train(case.train_mode)
    forward = torch.compile(model, backend="neuron") if mode == "compiled" else model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    last = 0
    for step in range(STEPS):
        if step == STEPS - 1:
            torch.neuron.synchronize()
            last = torch.neuron.metrics()["wall_ns"]
        output = forward(**batch)
        opt.zero_grad(set_to_none=True)
        output["loss"].backward()
        opt.step()
        if mode == "adaptive":
            wait_for_fused_compiles()
    torch.neuron.synchronize()
    m = torch.neuron.metrics()
    rt = runtime.get()
    keys = hashlib.sha256("\n".join(sorted(rt.executables.loaded)).encode()).hexdigest()[:12]
    report = explain.explain().shape_only
    assumed = [a for a in report if a["kind"] == "assumed"]
    read = [a for a in report if a["kind"] == "placeholder"]
    if mode == "compiled":
        torch._dynamo.reset()
    return {
        "last_step_ns": m["wall_ns"] - last,
        "wall_ns": m["wall_ns"],
        "launches": m["launches"],
        "executables": f"{len(rt.executables.loaded)}:{keys}",
        "hbm_peak": torch.neuron.max_memory_allocated(),
        "hbm_bytes": m["hbm_bytes"],
        "device_busy_ns": m["device_busy_ns"],
        "assumed": [f"{a['op']} at {a['where']}: {a['what']}" for a in assumed],
        "placeholders": [f"{a['op']} at {a['where']}" for a in read],
    }


def worker(name: str) -> None:
    """Prints one JSON line: each mode's measures (or its error)."""
    from neuron_helpers import first_line, quiet_transformers

    warnings.simplefilter("ignore")  # (shape-only mode warns at each line reading a value)
    if ZOO[name].family != "nn":
        quiet_transformers()
    out: dict[str, Any] = {"name": name, "numerics": os.environ["NEURON_SIM_NUMERICS"]}
    for mode in MODES:
        try:
            out[mode] = measure(name, mode)
        except Exception as e:  # noqa: BLE001  (reported; the next mode still runs)
            out[mode] = {"error": first_line(e)}
    print(json.dumps(out), flush=True)


def run(name: str, numerics: str, timeout_s: float) -> dict[str, Any]:
    """One model in its own process with numerics on or off."""
    env = worker_env(name) | {"NEURON_SIM_NUMERICS": numerics}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return last_json(stdout) or died(name, exit_reason(proc.returncode), stderr)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        return died(name, f"timed out after {timeout_s:.0f} s", stderr)


def compare(name: str, on: dict[str, Any], off: dict[str, Any]) -> list[dict[str, Any]]:
    """Per mode: same (every measure equal), assumed (data-dependent shapes), DIFFERENT
    (and which measures), or the error of either run."""
    rows = []
    for mode in MODES:
        a, b = on.get(mode), off.get(mode)
        row: dict[str, Any] = {"name": name, "mode": mode}
        if "died" in on or "died" in off:
            dead = on if "died" in on else off
            row |= {"verdict": "ERROR", "why": f"worker {dead['died']}: {dead['stderr'][-200:]}"}
        elif a is None or b is None or "error" in a or "error" in b:
            bad = a if a is None or "error" in a else b
            which = "on" if bad is a else "off"
            row |= {"verdict": "ERROR", "why": f"numerics {which}: {(bad or {}).get('error')}"}
        else:
            differ = [k for k in MEASURES if a[k] != b[k]]
            row |= {"on": a, "off": b, "differ": differ}
            if b["assumed"]:
                row |= {"verdict": "assumed", "why": "; ".join(dict.fromkeys(b["assumed"]))}
            elif differ:
                read = "; ".join(b["placeholders"])
                row |= {
                    "verdict": "DIFFERENT",
                    "why": ", ".join(f"{k} {a[k]} vs {b[k]}" for k in differ)
                    + (f" (the host read placeholders: {read})" if read else ""),
                }
            else:
                row |= {"verdict": "same", "why": ""}
        rows.append(row)
    return rows


def check(name: str, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Both runs of one model, compared mode by mode."""
    return compare(name, run(name, "on", timeout_s), run(name, "off", timeout_s))


def cells(row: dict[str, Any]) -> list[str]:
    on = row.get("on", {})
    return [
        row["name"],
        row["mode"],
        f"{on['last_step_ns'] / 1e6:.3f}" if on else "-",
        str(on.get("launches", "-")),
        str(on.get("executables", "-")).split(":")[0],
        f"{on['hbm_peak'] / 2**20:.2f}" if on else "-",
        row["verdict"],
        row["why"][:160],
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(ZOO)}")
    parser.add_argument("--jobs", type=int, default=JOBS, help="models at a time")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run")
    parser.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    names = args.names or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    start = time.monotonic()
    results: list[list[dict[str, Any]]] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(check, n, args.timeout) for n in names]
        for name, future in zip(names, futures, strict=True):
            results.append(future.result())
            print(f"{name}: {', '.join(r['verdict'] for r in results[-1])}", file=sys.stderr)
    rows = [r for model in results for r in model]
    columns = (
        "model",
        "mode",
        "last step ms",
        "launches",
        "executables",
        "HBM peak MiB",
        "",
        "why",
    )
    print(table([cells(r) for r in rows], columns))
    verdicts = [r["verdict"] for r in rows]
    print(
        f"shape-only invariant: {verdicts.count('same')} of {len(rows)} model-modes identical "
        f"(simulated time, launches, executables, HBM peak and traffic), "
        f"{verdicts.count('assumed')} with data-dependent shapes by assumption, "
        f"{verdicts.count('DIFFERENT')} different, {verdicts.count('ERROR')} errors; "
        f"{len(names)} models in {time.monotonic() - start:.0f} s"
    )
    return 0 if all(v in ("same", "assumed") for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
