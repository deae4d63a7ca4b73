"""torch.neuron.explain(): adaptive mode's cuts at the user's own lines; NEURON_EXPLAIN and
`trnsim explain`; torch.neuron.metrics_report()."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from trnsim.client.api import explain as explaining


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
        [sys.executable, "-m", "trnsim.cli", "explain", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=env,  # NEURON_EXPLAIN still set, as in the shell that ran the program
    )
    assert out.stdout.startswith("adaptive mode:") and "<string>:5" in out.stdout
    assert path.read_text() == written, "printing the report does not rewrite it"
    assert "RuntimeWarning" not in out.stderr


class _Breaks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        torch._dynamo.graph_break()  # the break
        return y.relu()


# (dynamo reads .grad of the non-leaf it resumes with, on the CPU too)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_breaks_and_recompiles_name_the_users_module_and_lines():
    model = torch.compile(_Breaks().to("neuron"), backend="neuron", dynamic=False)
    model(torch.randn(2, 4, device="neuron"))
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    model(torch.randn(3, 4, device="neuron"))  # a new shape: a recompile
    report = torch.neuron.explain()
    source = inspect.getsourcelines(_Breaks.forward)[1]
    mine = [b for b in report.graph_breaks if b["where"].startswith(f"{__file__}:{source + 2}")]
    assert mine, report.graph_breaks
    recompiled = [c for c in report.compiled if c.get("module", "").startswith("_Breaks.forward")]
    assert recompiled and recompiled[0]["called_at"] == f"{__file__}:{line}", report.compiled
    assert f"recompiled _Breaks.forward at {__file__}:{source}" in str(report)
