"""Training while the compile daemon hangs (SIGSTOP), measured in one run.

    python benchmarks/daemon_hang.py [--hang 30] [--at mid start] [--mode eager adaptive]
                                     [--daemon address auto] [--before 10] [--after 15]

For each case a small model trains on neuron beside the same model on CPU, with a batch of
a new size every 4th step, so compiles keep coming. The daemon is stopped for --hang
seconds, at the trainer's start or mid-run (after --before steps), then continued. Printed
per case: the largest gap between two steps (a gap that overlaps the hang counts as in
it), the first step's time from the trainer's launch (importing torch included), the
largest loss difference against CPU, the compiles done in process, and how long after
SIGCONT the trainer's compiles went back to the daemon. --daemon auto runs the trainer
with NEURON_COMPILE_DAEMON unset, its default address the stopped daemon's.
The trainer's warnings go to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnsim.daemon import launcher

TRAINER = """
import json, sys, time
import torch
from trnsim.client.core import runtime
end = float(sys.argv[1])
torch.manual_seed(0)
def make():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
cpu = make()
dev = make()
dev.load_state_dict(cpu.state_dict())
dev.to("neuron")
opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, dev)]
g = torch.Generator().manual_seed(1)
step = 0
while time.time() < end:
    x = torch.randn(1 + step // 4, 16, generator=g)  # a new batch size every 4th step
    losses = []
    for model, opt, device in ((cpu, opts[0], "cpu"), (dev, opts[1], "neuron")):
        loss = model(x.to(device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    client = runtime.get().compiler
    tiers = getattr(client, "tiers", {})
    local = getattr(client, "local", client)
    print(json.dumps({"t": time.time(), "step": step, "cpu": losses[0], "dev": losses[1],
                      "daemon": sum(tiers.values()), "here": getattr(local, "compiles", 0)}),
          flush=True)
    step += 1
"""


@dataclass(frozen=True)
class Case:
    mode: str  # eager | adaptive
    at: str  # start | mid
    daemon: str  # address | auto


def start_daemon(root: Path, address: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trnsim.daemon",
            "--address",
            address,
            "--cache-dir",
            str(root / "cache"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while launcher.get_info(address, timeout=0.5) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not start on {address}")
        time.sleep(0.05)
    return proc


def run_case(case: Case, hang_s: float, before: int, after_s: float) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="trn-hang-", dir="/tmp"))
    os.chmod(root, 0o700)
    (root / "xdg" / "trnsim").mkdir(parents=True, mode=0o700)
    address = f"unix:{root / 'xdg' / 'trnsim' / 'compiler.sock'}"
    daemon = start_daemon(root, address)
    env = {**os.environ, "NEURON_EAGER": case.mode, "XDG_RUNTIME_DIR": str(root / "xdg")}
    env.pop("NEURON_COMPILE_DAEMON", None)
    if case.daemon == "address":
        env["NEURON_COMPILE_DAEMON"] = address
    try:
        if case.at == "start":
            os.kill(daemon.pid, signal.SIGSTOP)
        launched = time.time()
        trainer = subprocess.Popen(
            [sys.executable, "-c", TRAINER, str(launched + 3600)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        lines: list[str] = []
        trained = threading.Event()
        threading.Thread(target=_collect, args=(trainer, lines, before, trained)).start()
        if case.at == "mid" and not trained.wait(600):
            raise RuntimeError("the trainer made no steps")
        os.kill(daemon.pid, signal.SIGSTOP)
        stop_at = time.time()
        time.sleep(hang_s)
        os.kill(daemon.pid, signal.SIGCONT)
        cont_at = time.time()
        time.sleep(after_s)
        trainer.terminate()
        trainer.wait(timeout=60)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        daemon.terminate()
        daemon.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    steps = [json.loads(line) for line in lines if line.startswith("{")]
    return summarize(steps, launched, stop_at, cont_at)


def _collect(
    trainer: subprocess.Popen[str], lines: list[str], before: int, trained: threading.Event
) -> None:
    """The trainer's step lines as they come; `trained` set after `before` of them."""
    assert trainer.stdout is not None
    for line in trainer.stdout:
        lines.append(line)
        if len(lines) >= before:
            trained.set()


def summarize(
    steps: list[dict[str, float]], launched: float, stop_at: float, cont_at: float
) -> dict[str, object]:
    gaps = [(b["t"] - a["t"], a["t"]) for a, b in itertools.pairwise(steps)]
    in_hang = [g for g, t in gaps if t + g > stop_at and t < cont_at]
    outside = [g for g, t in gaps if not (t + g > stop_at and t < cont_at)]
    back = next(
        (
            s["t"] - cont_at
            for s, p in zip(steps[1:], steps, strict=False)
            if s["t"] > cont_at and s["daemon"] > p["daemon"]
        ),
        None,
    )
    during = [s for s in steps if stop_at < s["t"] < cont_at]
    return {
        "steps": len(steps),
        "steps_during_hang": len(during),
        "first_step_s": round(steps[0]["t"] - launched, 2) if steps else None,
        "max_gap_in_hang_s": round(max(in_hang, default=0.0), 2),
        "max_gap_outside_s": round(max(outside, default=0.0), 2),
        "max_loss_diff": max((abs(s["cpu"] - s["dev"]) for s in steps), default=None),
        "compiled_here": steps[-1]["here"] if steps else 0,
        "daemon_answers": steps[-1]["daemon"] if steps else 0,
        "back_to_daemon_after_cont_s": None if back is None else round(back, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hang", type=float, default=30.0, help="seconds the daemon is stopped")
    parser.add_argument("--before", type=int, default=10, help="steps before a mid-run stop")
    parser.add_argument("--after", type=float, default=15.0, help="seconds trained after SIGCONT")
    parser.add_argument("--at", nargs="+", default=["mid", "start"], choices=["mid", "start"])
    parser.add_argument(
        "--mode", nargs="+", default=["eager", "adaptive"], choices=["eager", "adaptive"]
    )
    parser.add_argument(
        "--daemon",
        nargs="+",
        default=["address"],
        choices=["address", "auto"],
        help="address: NEURON_COMPILE_DAEMON set to it; auto: unset",
    )
    args = parser.parse_args()
    for daemon in args.daemon:
        for mode in args.mode:
            for at in args.at:
                case = Case(mode, at, daemon)
                result = run_case(case, args.hang, args.before, args.after)
                print(
                    json.dumps(
                        {"mode": mode, "at": at, "daemon": daemon, "hang_s": args.hang, **result}
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
