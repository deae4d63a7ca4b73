"""torch.neuron.explain(): adaptive mode's cuts at the user's own lines; NEURON_EXPLAIN and
`trnsim explain`; torch.neuron.metrics_report()."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import torch
from trnsim.client import explain as explaining


def test_a_cut_names_the_users_line_and_why():
    explaining.reset()
    torch.neuron.set_eager_mode("adaptive")
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).to("neuron")
        for _ in range(3):
            loss = model(torch.randn(4, 8).to("neuron")).sum()
            loss.backward()
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            loss.item()
    finally:
        torch.neuron.set_eager_mode("eager")
    report = torch.neuron.explain()
    mine = [c for c in report.cuts if c["where"] == f"{__file__}:{line}"]
    assert mine and {c["reason"] for c in mine} == {"sync"}
    table = str(report)
    assert f"{__file__}:{line}" in table and "the host needed the device's results" in table
    assert "ops dispatched" in torch.neuron.metrics_report()


def test_neuron_explain_writes_the_report_that_trnsim_explain_prints(tmp_path):
    path = tmp_path / "why.json"
    program = (
        "import torch\n"
        "torch.neuron.set_eager_mode('adaptive')\n"
        "x = torch.ones(4, device='neuron')\n"
        "for _ in range(3):\n"
        "    (x * 2 + 1).sum().item()\n"
    )
    env = {**os.environ, "NEURON_EXPLAIN": str(path)}
    subprocess.run([sys.executable, "-c", program], env=env, check=True, capture_output=True)
    cuts = json.loads(path.read_text())["cuts"]
    assert any(c["where"] == "<string>:5" and c["reason"] == "sync" for c in cuts)
    written = path.read_text()
    out = subprocess.run(
        [sys.executable, "-m", "trnsim.daemon.cli", "explain", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=env,  # NEURON_EXPLAIN still set, as in the shell that ran the program
    )
    assert out.stdout.startswith("adaptive mode:") and "<string>:5" in out.stdout
    assert path.read_text() == written, "printing the report does not rewrite it"
    assert "RuntimeWarning" not in out.stderr
