"""Compiled mode: torch.compile(backend="neuron") against eager mode on the same chip."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.daemon.helpers import daemon_stats, start_daemon


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def _delta(before: dict[str, int], key: str) -> int:
    return torch.neuron.metrics().get(key, 0) - before.get(key, 0)


def test_the_backend_is_found_after_a_plain_import() -> None:
    assert "neuron" in torch._dynamo.list_backends()


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_training_under_compile_is_bit_identical_to_eager(mode: str) -> None:
    torch.neuron.set_eager_mode(mode)
    try:
        eager = _mlp().to("neuron")
        compiled_model = copy.deepcopy(eager)
        compiled = torch.compile(compiled_model, backend="neuron")
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, compiled_model)]
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(6, 8, generator=g).to("neuron")
            losses = []
            for model, opt in zip((eager, compiled), opts, strict=True):
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            assert losses[0] == losses[1]
        for a, b in zip(eager.parameters(), compiled_model.parameters(), strict=True):
            assert torch.equal(a.cpu(), b.cpu())
    finally:
        torch.neuron.set_eager_mode("eager")


def test_a_compiled_forward_is_one_launch_and_compiles_nothing_when_warm() -> None:
    model = torch.compile(_mlp().to("neuron"), backend="neuron")
    x = torch.randn(6, 8, device="neuron")
    with torch.no_grad():
        model(x)  # the region compiles
        before = torch.neuron.metrics()
        y = model(x)
    assert _delta(before, "launches") == 1
    assert _delta(before, "executables_compiled") == 0
    assert _delta(before, "compiled_calls") == 1
    assert _delta(before, "fused_executions") == 1
    assert y.shape == (6, 4)


def test_the_first_call_compiles_the_region_and_launches_it_once() -> None:
    """A shape never seen: the region compiles at once, as one graph (none of its ops gets
    an executable of its own), and runs as one launch."""
    torch._dynamo.reset()  # (a shape other tests gave the model would make dynamo's next dynamic)
    model = torch.compile(_mlp().to("neuron"), backend="neuron")
    x = torch.randn(3, 7, 8, device="neuron")  # (a shape no other test compiles)
    before = torch.neuron.metrics()
    with torch.no_grad():
        y = model(x)
    assert _delta(before, "compiled_graphs_ready") == 1
    assert _delta(before, "fused_executions") == 1
    assert _delta(before, "op_by_op_ops") == 0
    assert _delta(before, "executables_compiled") == 1  # the region's graph alone
    assert torch.equal(y.cpu(), model._orig_mod(x).cpu())


def test_a_dropout_in_a_region_gets_no_executable_of_its_own() -> None:
    """Dropout draws from the CPU's generator; a region in which nothing else draws records
    it in order, so like every op the region takes, it compiles nothing of its own."""
    torch._dynamo.reset()
    f = torch.compile(
        lambda x: nn.functional.dropout(x * 2, 0.5, training=True).sum(), backend="neuron"
    )
    x = torch.randn(5, 11, device="neuron")  # (a shape no other test compiles)
    before = torch.neuron.metrics()
    f(x)
    assert _delta(before, "compiled_graphs_ready") == 1
    assert _delta(before, "executables_compiled") == 1  # the region's graph alone


def test_a_new_shape_recompiles_and_says_why() -> None:
    def scale(t: torch.Tensor) -> torch.Tensor:
        return (t * 3).relu() + 1

    f = torch.compile(scale, backend="neuron")
    before = torch.neuron.metrics()
    a = torch.randn(5, 3, device="neuron")
    b = torch.randn(7, 3, device="neuron")
    assert torch.equal(f(a).cpu(), scale(a).cpu())
    assert torch.equal(f(b).cpu(), scale(b).cpu())
    assert _delta(before, "compiled_dynamo_graphs") >= 2
    reasons = [
        r
        for e in torch.neuron.compiled_explain()
        if e.get("function") == "scale"
        for r in e["reasons"]
    ]
    assert any("size mismatch" in r and "expected 5, actual 7" in r for r in reasons), reasons


def _in_buckets(model: nn.Module, sizes: list[int], **compile_kwargs: Any) -> list[dict[str, int]]:
    """Trains `model` compiled (and a copy eagerly) on sequences of these lengths; asserts
    each step's output and gradients equal eager's; the metrics' changes per call."""
    eager = copy.deepcopy(model)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).pow(2).sum()

    compiled = torch.compile(loss, backend="neuron", **compile_kwargs)
    deltas = []
    for n in sizes:
        x = torch.randn(2, n, 8, device="neuron")
        if compile_kwargs.get("dynamic") is None:
            torch._dynamo.mark_dynamic(x, 1)
        before = torch.neuron.metrics()
        y = compiled(model, x)
        y.backward()
        deltas.append({k: v - before.get(k, 0) for k, v in torch.neuron.metrics().items()})
        z = loss(eager, x)
        z.backward()
        assert torch.equal(y.cpu(), z.cpu())
        for a, b in zip(model.parameters(), eager.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            assert torch.equal(a.grad.cpu(), b.grad.cpu())
            a.grad, b.grad = None, None
    return deltas


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_sizes_compile_once_per_bucket_and_compute_at_their_size(how: str) -> None:
    kwargs: dict[str, Any] = {"dynamic": True} if how == "dynamic=True" else {}
    deltas = _in_buckets(_block().to("neuron"), [5, 7, 6, 8, 9], **kwargs)
    # 5 opens bucket 8 (forward and backward: one executable each); 7, 6 and 8 run in it
    # and compile nothing; 9 opens bucket 16.
    assert [d["compiled_buckets"] for d in deltas] == [2, 0, 0, 0, 2]
    assert [d["compiled_bucket_runs"] for d in deltas] == [2, 2, 2, 2, 2]
    for d in deltas[1:4]:
        assert d["executables_compiled"] == 0
        assert d["compiled_graphs_ready"] == 0
    # A bucket's executable is priced at its bound: every size in it moves the same bytes.
    assert len({d["hbm_bytes"] for d in deltas[:4]}) == 1
    assert deltas[4]["hbm_bytes"] > deltas[0]["hbm_bytes"]
    what = [e["shape_bucket"] for e in torch.neuron.compiled_explain() if "shape_bucket" in e]
    assert any("->8: bucket compiled" in w for w in what), what


def test_listed_buckets_and_exact_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    from trnsim.client.modes import compiled
    from trnsim.policy import buckets

    monkeypatch.setattr(compiled, "_BUCKETS", buckets.parse("12,24"))
    deltas = _in_buckets(_block().to("neuron"), [5, 11, 13], dynamic=True)
    assert [d["compiled_buckets"] for d in deltas] == [2, 0, 2]
    monkeypatch.setattr(compiled, "_BUCKETS", buckets.parse("exact"))
    deltas = _in_buckets(_block().to("neuron"), [3, 4], dynamic=True)
    assert [d["compiled_buckets"] for d in deltas] == [0, 0]
    assert [d["compiled_graphs_ready"] for d in deltas] == [2, 2]  # each size its own


def test_a_region_that_cannot_stay_one_graph_is_not_bucketed() -> None:
    """Batch norm in eval runs on its own (its CPU kernel returns other shapes than its Meta
    kernel) and cuts the region: such a graph compiles per size, says why, and computes
    what eager mode computes."""
    stats = [torch.randn(4, device="neuron"), torch.rand(4, device="neuron") + 0.5]

    def f(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.batch_norm(t * 2, *stats, training=False).relu().sum(-1)

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, 4, device="neuron")
        assert torch.equal(compiled(x).cpu(), f(x).cpu())
    what = [e["shape_bucket"] for e in torch.neuron.compiled_explain() if "shape_bucket" in e]
    assert any("=5->8" in w and "no bucket (cut (first_sight))" in w for w in what), what


def test_a_graph_with_a_cpu_random_op_is_not_traced_at_other_sizes() -> None:
    """Tracing at a bucket's sizes would run a CPU random op (it runs when called, not
    recorded) and draw from the generator: such a graph compiles per size instead."""

    def f(t: torch.Tensor) -> torch.Tensor:
        return (t * 2).sum(-1) + torch.rand(t.shape[0]).to(t.device)

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, 4, device="neuron")
        torch.manual_seed(n)
        before = torch.neuron.metrics()
        got = compiled(x)
        assert _delta(before, "compiled_buckets") == 0
        torch.manual_seed(n)
        assert torch.equal(got.cpu(), f(x).cpu())


def test_dropout_under_compile_stays_in_the_graph_and_draws_what_eager_draws() -> None:
    """Dropout draws from the CPU's generator: a region nothing else draws in records it,
    so training is one forward and one backward launch, bit-identical to eager mode."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.Dropout(0.3), nn.GELU(), nn.Linear(32, 4), nn.Dropout(0.2)
    ).to("neuron")
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    x = torch.randn(6, 8, device="neuron")
    for step in range(3):
        losses = []
        for forward, opt in zip((eager, compiled), opts, strict=True):
            torch.manual_seed(100 + step)
            before = torch.neuron.metrics()
            loss = forward(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert losses[0] == losses[1]
        assert _delta(before, "fused_executions") == 2  # (the compiled step's)
        assert _delta(before, "cut_not_fusible") == 0
    for a, b in zip(eager.parameters(), model.parameters(), strict=True):
        assert torch.equal(a.cpu(), b.cpu())


def test_a_cpu_random_op_in_the_graph_keeps_dropout_on_its_own() -> None:
    """A CPU random op in the graph draws when it is called, ahead of anything recorded:
    the device's dropout then runs on its own, in order, and the draws are eager's."""

    def f(t: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(t.shape[0]).to(t.device)  # (on the CPU)
        return torch.nn.functional.dropout(t, 0.5).sum(-1) + noise

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(8, 4, device="neuron")
    for step in range(2):
        torch.manual_seed(step)
        before = torch.neuron.metrics()
        got = compiled(x)
        assert _delta(before, "fused_ops") == 2  # sum and add; dropout ran on its own
        torch.manual_seed(step)
        assert torch.equal(got.cpu(), f(x).cpu())


def test_a_graph_break_and_a_data_dependent_op_never_fail_the_step() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        y = t * 2
        if y.sum().item() > 0:  # a graph break
            y = y + 1
        return torch.nonzero(y > 1.5).float().sum() + y.sum()  # a data-dependent shape

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(16, device="neuron")
    for _ in range(3):
        assert torch.equal(compiled(x).cpu(), f(x).cpu())


# Dynamo, tracing the optimizer, meets torch.jit.script_method's deprecation warning. Under
# compile AdamW computes its bias corrections with tensor ops instead of Python floats, so
# the result is close to eager's, not identical.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_compiled_clip_and_optimizer_step_matches_eager() -> None:
    models = [_mlp().to("neuron") for _ in range(2)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]

    def clip_and_step() -> None:
        torch.nn.utils.clip_grad_norm_(models[1].parameters(), 1.0)
        opts[1].step()

    step = torch.compile(clip_and_step, backend="neuron")
    x = torch.randn(6, 8, device="neuron")
    before = torch.neuron.metrics()
    for _ in range(6):  # (dynamo recompiles as AdamW's step count changes, then generalises)
        for i, (model, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad()
            model(x).sum().backward()
            if i == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            else:
                step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-6)
    # compiled, not run eagerly instead (dynamo restarts its analysis of AdamW's step once)
    assert _delta(before, "compiled_fallbacks") == 0
    assert _delta(before, "compiled_graphs_ready") > 0


def test_set_default_backend_makes_neuron_the_backend() -> None:
    torch.compiler.set_default_backend("neuron")
    try:
        before = torch.neuron.metrics()
        f = torch.compile(lambda t: t.sin() * 2)
        x = torch.randn(4, device="neuron")
        assert torch.equal(f(x).cpu(), (x.sin() * 2).cpu())
        assert _delta(before, "compiled_dynamo_graphs") == 1
    finally:
        torch.compiler.set_default_backend("inductor")


def test_generate_with_a_static_kv_cache_under_compile_gives_eager_tokens() -> None:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 128, (1, 6))
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    cpu = model.generate(ids, cache_implementation="static", **kwargs)
    model.to("neuron")
    model.forward = torch.compile(model.forward, backend="neuron")
    before = torch.neuron.metrics()
    for _ in range(2):
        out = model.generate(ids.to("neuron"), cache_implementation="static", **kwargs)
        assert torch.equal(out.cpu(), cpu)
    assert _delta(before, "compiled_calls") > 0
    assert _delta(before, "fused_executions") > 0


def test_a_second_run_of_a_compiled_script_compiles_nothing(tmp_path: Path) -> None:
    """Two processes against one daemon: everything the second needs is in its caches."""
    daemon = start_daemon(tmp_path)
    env = {**os.environ, "NEURON_COMPILE_DAEMON": daemon.address}
    script = Path(__file__).with_name("compiled_script.py")
    try:
        runs, compiles = [], []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, str(script)],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            compiles.append(daemon_stats(daemon.address).compiles)
    finally:
        daemon.stop()
    assert runs[0]["losses"] == runs[1]["losses"]
    assert runs[1]["fused"] > 0 and runs[1]["ready"] > 0
    assert compiles[0] > 0
    assert compiles[1] == compiles[0], compiles


@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama"])
def test_transformers_models_run_dynamic_lengths_in_buckets_bit_identical(arch: str) -> None:
    """Real architectures (transformers, small configs) under dynamic=True: sequence lengths
    5, 7, 6 run in bucket 8 and 9 in bucket 16, one executable each, and every output equals
    eager mode's bit for bit."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64
        )
        model = transformers.GPT2LMHeadModel(config)
    elif arch == "bert":
        config = transformers.BertConfig(
            vocab_size=96,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
        )
        model = transformers.BertModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        model = transformers.LlamaForCausalLM(config)
    model = model.eval().to("neuron")
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    before = torch.neuron.metrics()
    g = torch.Generator().manual_seed(1)
    for n in (5, 7, 6, 9):
        ids = torch.randint(0, 96, (2, n), generator=g).to("neuron")
        with torch.no_grad():
            got = compiled(input_ids=ids)[0]
            want = model(input_ids=ids)[0]
        assert torch.equal(got.cpu(), want.cpu()), n
    assert _delta(before, "compiled_buckets") == 2
    assert _delta(before, "compiled_bucket_runs") == 4
    assert _delta(before, "compiled_buckets_refused") == 0
    assert _delta(before, "compiled_fallbacks") == 0


PYTORCH_BACKEND_SCRIPT = """
import torch
def f(x):
    y = x * 2
    if y.sum().item() > 0:  # a graph break: the .item() runs eagerly, in trnsim's kernels
        return y - 1
    return y + 1
x = torch.arange(8.0, device="neuron")
print(torch.compile(f, backend=BACKEND)(x).sum().item())
"""


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_pytorchs_own_backends_never_trace_trnsim(backend: str) -> None:
    """With any dynamo backend, the device's kernels that run at a graph break are skipped by
    dynamo (before, it traced them and warned about torch._C._to_dlpack): a new process,
    warnings as errors, and dynamo imported only by torch.compile."""
    script = f"BACKEND = {backend!r}\n" + PYTORCH_BACKEND_SCRIPT
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NEURON_COMPILE_DAEMON": "off"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) == sum(2 * i - 1 for i in range(8))
