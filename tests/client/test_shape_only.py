"""Shape-only mode (NEURON_SIM_NUMERICS=off): nothing is computed, host memory stays
untouched, reads are placeholders named by their line, host-supplied values stay real and
data-dependent sizes take their documented assumptions."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from trnsim.client.api import explain
from trnsim.client.core import env, runtime
from trnsim.simulator import shape_only


@contextlib.contextmanager
def shape_only_core() -> Iterator[runtime.Runtime]:
    saved = runtime._runtime
    explain.reset()
    rt = runtime._runtime = runtime.Runtime(replace(env.read(), numerics=False))
    try:
        yield rt
    finally:
        rt.close()
        runtime._runtime = saved
        shape_only.set_numerics(True)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_gigabyte_of_device_tensors_costs_no_host_memory() -> None:
    with shape_only_core():
        small = torch.empty(4, device="neuron")
        (small * 2).exp_() + small  # (the first ops load and compile what the next need)
        before = _rss()
        x = torch.empty(256, 1024, 1024, device="neuron")  # 1 GiB
        y = (x * 2).exp_() + x
        torch.neuron.synchronize()
        grown = _rss() - before
        assert y.shape == x.shape and torch.neuron.max_memory_allocated() >= 3 << 30
    assert grown < 32 << 20, f"host RSS grew {grown >> 20} MiB"


def test_a_read_value_is_a_placeholder_warned_at_its_line_and_explained() -> None:
    with shape_only_core():
        w = torch.empty(4, 4, device="neuron")  # (never written: its values are unknown)
        with pytest.warns(explain.ShapeOnlyWarning) as caught:
            value = (w @ w).sum().item()
        assert value == 0.0
        assert caught[0].filename == __file__
        rows = [r for r in explain.explain().shape_only if r["kind"] == "placeholder"]
        assert rows and rows[0]["where"].startswith(f"{__file__}:")


def test_ids_and_masks_the_host_supplied_stay_real() -> None:
    with shape_only_core(), warnings.catch_warnings():
        warnings.simplefilter("error", explain.ShapeOnlyWarning)
        mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).to("neuron")
        assert not bool(mask.all())
        assert mask.sum(-1).tolist() == [2, 3]
        positions = torch.arange(3, device="neuron").expand(2, 3)
        assert (positions * mask).max().item() == 2


def test_routing_through_a_scattered_mask_is_uniform_and_explained() -> None:
    experts, tokens, top_k = 8, 64, 2
    with shape_only_core():
        logits = torch.empty(tokens, experts, device="neuron")  # (unknown, as a router's)
        chosen = logits.topk(top_k, dim=-1).indices
        mask = torch.nn.functional.one_hot(chosen, experts).permute(2, 1, 0)
        rows, _ = torch.where(mask[3])
        assert rows.shape == (tokens * top_k // experts,)
        every = torch.nonzero(logits > 0)
        assert every.shape == (tokens * experts, 2)  # (unknown: the upper bound)
        assumed = [r for r in explain.explain().shape_only if r["kind"] == "assumed"]
        assert any("scattered" in r["what"] for r in assumed), assumed
