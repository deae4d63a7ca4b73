"""Recording the shape registry (NEURON_RECORD_SHAPES): what a run dispatches, merged across
runs and processes, and the tests generated from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trnsim.client.api import registry
from trnsim.client.core.shapes import load

PROGRAM = """
import torch
x = torch.ones(4, 3, device="neuron")
y = (x * 2.5).sum(dim=1)
idx = torch.tensor([0, 2], device="neuron")
print(x[idx].shape, y.cpu().tolist())
"""


def _record(path: Path, source: str) -> None:
    env = {**os.environ, "NEURON_RECORD_SHAPES": str(path), "NEURON_RECORD_SOURCE": source}
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, capture_output=True)


def test_a_run_records_its_signatures_and_runs_merge(tmp_path):
    path = tmp_path / "shapes.jsonl"
    _record(path, "first")
    first = {s.key(): s for s in load(path)}
    ops = {s.op for s in first.values()}
    assert {"aten::mul.Tensor", "aten::sum.dim_IntList", "aten::index.Tensor"} <= ops
    mul = next(s for s in first.values() if s.op == "aten::mul.Tensor")
    assert mul.args[0]["tensor"] == [4, 3] and mul.args[0]["device"] == "neuron"
    assert mul.args[1] == 2.5 and mul.sources == {"first"}
    _record(path, "second")
    second = {s.key(): s for s in load(path)}
    assert second.keys() == first.keys(), "the same signatures, counted twice"
    assert all(second[k].count == 2 * first[k].count for k in first)
    assert all(s.sources == {"first", "second"} for s in second.values())


def test_tests_generated_from_a_registry_pass_in_both_modes(tmp_path):
    path = tmp_path / "shapes.jsonl"
    _record(path, "program")
    results = registry.run_all(load(path), ["eager", "adaptive"])
    for outcomes in results.values():
        assert [o for o in outcomes if o.status == "fail"] == []
        assert sum(o.status == "pass" for o in outcomes) >= 5


def test_the_command_line_tests_and_summarises(tmp_path):
    path = tmp_path / "shapes.jsonl"
    _record(path, "program")
    trnsim = [sys.executable, "-m", "trnsim.cli"]
    out = subprocess.run(
        [*trnsim, "registry", "test", str(path), "--results", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "0 failed" in out
    stats = subprocess.run(
        [*trnsim, "registry", "stats", str(path), "--results", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "signatures of" in stats and "aten::mul.Tensor" in stats
    missing = subprocess.run(
        [*trnsim, "registry", "stats", str(tmp_path / "none.jsonl")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "no registry file" in missing.stderr


def test_a_malformed_registry_file_is_one_line_that_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"op": "aten::mul.Tensor"}\nnot json\n')
    out = subprocess.run(
        [sys.executable, "-m", "trnsim.cli", "registry", "stats", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and f"{path}:1: not a recorded op signature" in out.stderr


def test_trnsim_record_help_names_trnsim_record():
    out = subprocess.run(
        [sys.executable, "-m", "trnsim.cli", "record", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.startswith("usage: trnsim record") and "NEURON_RECORD_SHAPES" in out


def test_a_gzip_registry_records_merges_and_samples_by_op(tmp_path):
    path = tmp_path / "shapes.jsonl.gz"
    _record(path, "first")
    _record(path, "second")
    assert path.read_bytes()[:2] == b"\x1f\x8b", "written compressed"
    signatures = load(path)
    assert signatures and all(s.sources == {"first", "second"} for s in signatures)
    sample = registry.stratified(signatures, 1)
    assert sorted(s.op for s in sample) == sorted({s.op for s in signatures})


def test_a_signature_the_cpu_answers_two_ways_is_skipped_not_failed():
    # embedding_bag's backward on random bag offsets, bag sizes and max indices, as the sweep
    # recorded it (Kimi K2.5's vision tower): the CPU reads outside its inputs (bag -1, the
    # row before the gradient), so its answer is whatever memory lies there, no reference.
    # The CPU's second answer, its inputs between NaN guards, tells it every time.
    sweep = Path(__file__).with_name("sweep.jsonl.gz")
    sig = next(s for s in load(sweep) if s.op == "aten::_embedding_bag_backward.default")
    outcome = registry.run_signature(sig, "eager")
    assert outcome.status == "skip" and "two ways" in outcome.reason, outcome
