"""Training on neuron equals training on CPU; counters show what was compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from train_gpt import GPT, GPTConfig, make_batches, train

RTOL = 1e-5


def _compare_params(cpu_model, dev_model):
    for (name, a), (_, b) in zip(
        cpu_model.named_parameters(), dev_model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=RTOL, atol=1e-6, msg=name)


def test_gpt_trains_like_cpu_for_20_steps():
    torch.manual_seed(0)
    cfg = GPTConfig()
    cpu_model = GPT(cfg)
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    batches = make_batches(cfg, 20, 8)
    cpu_losses = train(cpu_model, batches, "cpu")
    dev_losses = train(dev_model, batches, "neuron")
    for step, (a, b) in enumerate(zip(cpu_losses, dev_losses, strict=True)):
        assert b == pytest.approx(a, rel=RTOL), f"step {step}"
    _compare_params(cpu_model, dev_model)


def test_second_identical_step_compiles_nothing(metrics_delta):
    torch.manual_seed(1)
    cfg = GPTConfig(n_layer=1)
    model = GPT(cfg).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = make_batches(cfg, 3, 4, seed=1)
    compiled = []
    for x, y in batches:
        before = torch.neuron.metrics()["executables_compiled"]
        loss = model(x.to("neuron"), y.to("neuron"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        compiled.append(torch.neuron.metrics()["executables_compiled"] - before)
    assert compiled[1] == 0 and compiled[2] == 0, compiled
    d = metrics_delta()
    assert d["cache_hits"] > d["cache_misses"] > 0
    assert d["launches"] > 0 and d["device_busy_ns"] > 0 and d["host_busy_ns"] > 0


OPTIMIZERS = [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (torch.optim.AdamW, {"lr": 0.01}),
    (torch.optim.Adamax, {"lr": 0.01}),
    (torch.optim.NAdam, {"lr": 0.01}),
    (torch.optim.RAdam, {"lr": 0.01}),
    (torch.optim.Adagrad, {"lr": 0.1}),
    (torch.optim.Adadelta, {"lr": 1.0}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}),
    (torch.optim.Rprop, {"lr": 0.01}),
    (torch.optim.ASGD, {"lr": 0.01}),
]


def _run_optimizer(cls, kwargs, device, variant):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(
        device
    )
    extra = {variant: True} if variant else {"foreach": False}
    opt = cls(model.parameters(), **kwargs, **extra)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(5, 8, generator=g).to(device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def _variants(cls):
    out = [None, "foreach"]
    if "fused" in cls.__init__.__code__.co_varnames and cls in (
        torch.optim.SGD,
        torch.optim.Adam,
        torch.optim.AdamW,
        torch.optim.Adagrad,
    ):
        out.append("fused")
    return out


@pytest.mark.parametrize(
    ("cls", "kwargs", "variant"),
    [(c, k, v) for c, k in OPTIMIZERS for v in _variants(c)],
    ids=lambda v: (
        getattr(v, "__name__", None) if isinstance(v, type) else (v if isinstance(v, str) else None)
    ),
)
def test_optimizers_match_cpu(cls, kwargs, variant):
    expected = _run_optimizer(cls, kwargs, "cpu", variant if variant != "fused" else "foreach")
    got = _run_optimizer(cls, kwargs, "neuron", variant)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
