"""Warm starts: a run records its graphs (NEURON_RECORD_GRAPHS), `trnsim precompile` compiles
them through a real daemon, and the next run compiles nothing; manifests of several runs
merge, and a damaged manifest is one line that says so."""

from __future__ import annotations

import os
import subprocess
import sys

from trnsim.compiler import manifest

from .helpers import run_json

TRNSIM = [sys.executable, "-m", "trnsim.cli"]

TRAIN = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
model.to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 16).to("neuron")).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
loss.item()
print(json.dumps(torch.neuron.metrics()))
"""


def _train(env: dict[str, str], steps: int = 6) -> dict[str, int]:
    return run_json(TRAIN, env, str(steps))  # type: ignore[no-any-return]


def test_a_precompiled_run_compiles_nothing_and_fuses_from_its_first_steps(daemon, short_tmp):
    graphs = short_tmp / "run.graphs"
    env = {
        **os.environ,
        "NEURON_COMPILE_DAEMON": daemon.address,
        "NEURON_EAGER": "adaptive",
        "NEURON_SIM_COMPILE_CLOCK": "on",  # a fused graph waits its modelled compile time
        "NEURON_RECORD_GRAPHS": str(graphs),
    }
    cold = _train(env)
    recorded = manifest.read(graphs)
    assert cold["executables_compiled"] > 0 and len(recorded) >= cold["executables_compiled"]
    assert {r.options.opt_level for r in recorded.values()} == {0, 2}, "per-op and fused graphs"
    assert cold["fused_executions"] == 0, "cold: fused graphs are still compiling"

    pre = subprocess.run(
        [*TRNSIM, "--address", daemon.address, "precompile", str(graphs), str(graphs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert pre.stdout.startswith(f"{len(recorded)} graphs: ") and "0 failed" in pre.stdout

    del env["NEURON_RECORD_GRAPHS"]
    warm = _train(env)
    assert warm["executables_compiled"] == 0 and warm["compile_wait_ns"] == 0
    # What the cold run compiled, and the fused graphs it had compiling in the background.
    assert warm["executables_fetched"] > cold["executables_compiled"]
    assert warm["fused_executions"] > 0 and warm["fused_graphs_fetched"] > 0
    first = _train(env, steps=2)  # step 1 runs op by op (ops met the first time); step 2 forms
    # each graph once, and runs it fused at that first flush
    assert first["fused_executions"] > 0 and first["executables_compiled"] == 0


def test_manifests_of_several_runs_merge_and_a_damaged_one_is_one_line(short_tmp):
    graphs = short_tmp / "m.graphs"
    env = {**os.environ, "NEURON_COMPILE_DAEMON": "off", "NEURON_RECORD_GRAPHS": str(graphs)}
    _train(env, steps=1)
    first = set(manifest.read(graphs))
    _train({**env, "NEURON_EAGER": "adaptive"}, steps=3)
    merged = set(manifest.read(graphs))
    assert first < merged, "the second run's fused graphs join the first run's"
    graphs.write_bytes(graphs.read_bytes()[:-7])
    out = subprocess.run(
        [*TRNSIM, "precompile", str(graphs)], capture_output=True, text=True, check=False
    )
    assert (
        out.returncode == 2 and out.stderr.count("\n") == 1 and "runs past the file" in out.stderr
    )
