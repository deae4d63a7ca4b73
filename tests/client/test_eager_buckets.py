"""Eager ops whose one size takes several values at one line compile per shape bucket
(client/door/buckets.py): computed at their size, bit for bit, and priced at the bucket's."""

from __future__ import annotations

import inspect

import torch
from trnsim.client.core import runtime

# (13 columns: no other test's op has these shapes, so each compile counted here is this
# test's, whatever ran before in the process; the sweep's registry tests run first)
W = torch.randn(16, 13)
# Seven token counts in buckets 4, 8 and 16 make the size dynamic; later ones in those buckets
# compile nothing (a new bucket, 32, compiles once).
FIRST = [5, 9, 3, 12, 7, 6, 10]
LATER = [11, 13, 4, 15, 14, 8, 2 * 10]


def _compiled() -> int:
    return torch.neuron.metrics()["executables_compiled"]


def _tokens(n: int) -> torch.Tensor:
    return torch.randn(n, 16)


def test_a_size_met_with_several_values_stops_compiling_once_its_buckets_are_known():
    w = W.to("neuron")
    compiles: list[int] = []
    for n in FIRST + LATER:
        x = _tokens(n)
        before = _compiled()
        got = x.to("neuron") @ w  # one line: one family of signatures
        compiles.append(_compiled() - before)
        assert torch.equal(got.cpu(), x @ W), n  # computed at its own size, as on the CPU
    # one compile per size until the seventh value makes it dynamic: that one compiles the
    # buckets of the sizes met so far (4, 8, 16); then only a new bucket (32) compiles
    assert compiles[:6] == [1] * 6
    assert compiles[6] >= 3
    assert compiles[7:] == [0, 0, 0, 0, 0, 0, 1]


def _project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w  # (one line for every call)


def test_a_bucketed_size_is_priced_at_its_bucket():
    w = W.to("neuron")
    for n in [17, 18, 19, 20, 21, 22, 23]:  # (bucket 32)
        _ = _project(_tokens(n).to("neuron"), w)
    times = {}
    for n in (25, 32):  # 25 runs in bucket 32's executable; 32 is its own
        x = _tokens(n).to("neuron")
        torch.neuron.synchronize()
        before = torch.neuron.metrics()
        _ = _project(x, w)
        torch.neuron.synchronize()
        after = torch.neuron.metrics()
        times[n] = (
            after["device_busy_ns"] - before["device_busy_ns"],
            after["op_bucket_signatures"] - before["op_bucket_signatures"],
        )
    assert times[25] == (times[32][0], 1)
    assert times[32][1] == 0


def test_sizes_a_line_meets_with_few_values_compile_exactly(metrics_delta):
    w = W.to("neuron")
    for n in [3, 5, 6, 3, 5, 6]:  # (a model's few static shapes at one line)
        _ = _tokens(n).to("neuron") @ w
    assert metrics_delta()["op_bucket_signatures"] == 0


def test_explain_names_the_line_and_its_buckets():
    w = W.to("neuron")
    line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
    for n in [33, 35, 37, 39, 41, 43, 45, 47]:
        _ = torch.relu(_tokens(n).to("neuron") @ w)
    report = torch.neuron.explain()
    where = f"{__file__}:{line}"
    rows = [r for r in report.op_buckets if r["where"] == where]
    assert {r["op"] for r in rows} >= {"aten::mm.default"}
    mm = next(r for r in rows if r["op"] == "aten::mm.default")
    assert mm["dynamic"].startswith("tensor 0 dim 0") and "(64, 16) (16, 13)" in mm["buckets"]
    assert mm["signatures"] == 2  # (45 and 47: the six before compiled at their own sizes)
    assert "eager shape buckets" in str(report) and where in str(report)
    assert runtime.get().dynamic_sizes.buckets.bound(47) == 64
