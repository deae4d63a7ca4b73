"""Compile time on the clocks: the simulated host waits for the modelled compile time a
compile costs it (all of a compile it made, none for a hit), an adaptive graph's fused
executable is usable only once its compile time has passed on the simulated clock, and
NEURON_SIM_COMPILE_SCALE burns CPU for it. Fresh processes: the settings are read when the
runtime starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from trnsim.compiler.compile_time import burn

EAGER = """
import json, torch
x = torch.randn(64, 64).to("neuron")
m0 = torch.neuron.metrics()
y = torch.relu(x); torch.neuron.synchronize()
m1 = torch.neuron.metrics()
z = torch.relu(x); torch.neuron.synchronize()
m2 = torch.neuron.metrics()
from trnsim.client.core import runtime
exe = next(iter(runtime.get().executables.loaded.values()))
print(json.dumps({"first": m1["host_ns"] - m0["host_ns"], "second": m2["host_ns"] - m1["host_ns"],
                  "wait": m1["compile_wait_ns"] - m0["compile_wait_ns"],
                  "modelled": [e.executable.modelled_compile_seconds for e in runtime.get().executables.loaded.values()]}))
"""

ADAPTIVE = """
import json, time, torch
torch.neuron.set_eager_mode("adaptive")
w = torch.randn(64, 64).to("neuron")
def step():
    y = torch.tanh(w @ w) * 2 + 1
    return y.sum().item()
from trnsim.client.core import runtime
rt = runtime.get()
for _ in range(3):
    step()
for s in rt.recorder.graphs.values():  # the background compile is done (real time)
    while s.future is not None and not s.future.done():
        time.sleep(0.01)
for _ in range(5):
    step()
states = [s for s in rt.recorder.graphs.values() if s.history.requested]
m = torch.neuron.metrics()
print(json.dumps({"ready": m["fused_compiles_ready"], "fused": m["fused_executions"],
                  "waits": [s.ready_at_ns - s.submitted_ns for s in states],
                  "ready_at": [s.ready_at_ns for s in states],
                  "host": rt.host_ns}))
"""


def _run(code: str, **env: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NEURON_COMPILE_DAEMON": "off", "NEURON_SIM_COMPILE_SCALE": "0", **env},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_an_eager_op_waits_for_its_compile_on_the_simulated_clock():
    on = _run(EAGER, NEURON_SIM_COMPILE_CLOCK="on")
    off = _run(EAGER, NEURON_SIM_COMPILE_CLOCK="off")
    relu = max(on["modelled"])  # (the copy to the device compiled nothing)
    assert on["wait"] >= int(relu * 1e9) > 0, on
    assert on["first"] - off["first"] == on["wait"], "the wait is all the difference"
    assert on["second"] == off["second"], "a hit costs no compile time"
    assert off["wait"] == 0


def test_a_fused_graph_is_usable_only_once_its_compile_time_has_passed():
    on = _run(ADAPTIVE, NEURON_SIM_COMPILE_CLOCK="on")
    off = _run(ADAPTIVE, NEURON_SIM_COMPILE_CLOCK="off")
    assert off["ready"] >= 1 and off["fused"] >= 1
    assert on["waits"] and all(w > 0 for w in on["waits"]), on
    assert all(t > on["host"] for t in on["ready_at"]), "its time has not come on the clock"
    assert on["ready"] == 0 and on["fused"] == 0, "still op by op: the compile is not over"


def test_burning_keeps_the_cpu_busy_for_the_time_asked():
    start = time.thread_time()
    burn(0.05)
    assert time.thread_time() - start >= 0.05
    start = time.process_time()
    burn(0.05, background=True)  # (on a thread of its own, at the lowest priority)
    assert time.process_time() - start >= 0.05
