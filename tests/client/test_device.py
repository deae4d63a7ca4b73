"""The neuron device as a PyTorch user meets it: registration, torch.neuron, tensors."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
from trnsim.client.core import env


def test_bare_import_torch_registers_neuron():
    code = "import torch; t = torch.ones(2, device='neuron'); print(t.device, torch.neuron.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["neuron:0", "True"]


@pytest.mark.parametrize("first", ["core.shapes", "api.registry", "modes.adaptive", "door.kernel"])
def test_a_program_may_import_a_client_module_before_torch(first):
    floor, module = first.split(".")
    code = f"from trnsim.client.{floor} import {module}; import torch; print(torch.ones(2, device='neuron').sum().item())"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2.0", out.stderr[-2000:]


def test_registration_does_not_import_dynamo():
    code = "import sys, torch; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_device_module_mirrors_cuda():
    n = torch.neuron
    assert n.is_available() and n.device_count() == 1 and n.current_device() == 0
    assert "NeuronCore" in n.get_device_name()
    n.synchronize()
    assert isinstance(n.metrics(), dict)


def test_factories_views_and_round_trip():
    x = torch.arange(12.0).reshape(3, 4)
    d = x.to("neuron")
    assert d.device.type == "neuron" and d.is_neuron
    assert torch.equal(d.cpu(), x)
    assert torch.equal(d.t().cpu(), x.t())
    assert torch.equal(d[1:, ::2].cpu(), x[1:, ::2])
    z = torch.zeros(2, 3, device="neuron", dtype=torch.bfloat16)
    assert z.dtype == torch.bfloat16 and z.sum().item() == 0
    assert torch.equal(torch.full((2,), 7, device="neuron").cpu(), torch.full((2,), 7))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    ],
)
def test_dtypes(dtype):
    x = (torch.arange(10) % 3).to(dtype)
    d = x.to("neuron")
    assert d.dtype == dtype
    assert torch.equal(d.cpu(), x)
    if dtype != torch.bool:
        assert torch.equal((d * 2).cpu(), x * 2)
    assert torch.equal((d == 1).cpu(), x == 1)


def test_in_place_through_views():
    x = torch.zeros(4, 4)
    d = x.to("neuron")
    d[1].fill_(3.0)
    d[:, 2].add_(1.0)
    x[1].fill_(3.0)
    x[:, 2].add_(1.0)
    assert torch.equal(d.cpu(), x)


def test_masks_indexing_and_data_dependent_shapes(metrics_delta):
    x = torch.randn(6, 5)
    d = x.to("neuron")
    assert torch.equal(d[d > 0].cpu(), x[x > 0])
    assert torch.equal(torch.nonzero(d > 0).cpu(), torch.nonzero(x > 0))
    idx = torch.tensor([0, 2, 2])
    d[idx.to("neuron")] = 1.0
    x[idx] = 1.0
    assert torch.equal(d.cpu(), x)
    assert metrics_delta()["dynamic_shape_ops"] >= 2


def test_neuron_1_is_a_clear_error():
    with pytest.raises(RuntimeError, match="one simulated NeuronCore"):
        torch.empty(2, device="neuron:1")
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        torch.ones(2).to("neuron:1")


def test_core_from_local_rank_and_visible_cores(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    assert env.read().core == 3
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "5-6")
    assert env.read().core == 5
    monkeypatch.setenv("NEURON_SIM_TARGET", "trn9")
    with pytest.raises(env.ConfigError, match="trn1, trn2"):
        env.read()


def test_the_compile_settings_are_read_in_env(monkeypatch):
    monkeypatch.delenv("NEURON_COMPILE_DAEMON", raising=False)
    monkeypatch.delenv("NEURON_COMPILE_DEADLINE", raising=False)
    assert env.compile_daemon() == "auto" and env.compile_deadline_s() == 660.0
    monkeypatch.setenv("NEURON_COMPILE_DAEMON", " off ")
    monkeypatch.setenv("NEURON_COMPILE_DEADLINE", "30")
    assert env.compile_daemon() == "off" and env.compile_deadline_s() == 30.0
    for bad in ("soon", "0", "-5", "nan"):
        monkeypatch.setenv("NEURON_COMPILE_DEADLINE", bad)
        with pytest.raises(env.ConfigError, match="expected seconds"):
            env.compile_deadline_s()
    monkeypatch.setenv("NEURON_SIM_COMPILE_SCALE", "")
    assert env.compile_scale() == 0.05
    monkeypatch.setenv("NEURON_SIM_COMPILE_SCALE", "1")
    assert env.compile_scale() == 1.0
    for bad in ("fast", "-1", "nan"):
        monkeypatch.setenv("NEURON_SIM_COMPILE_SCALE", bad)
        with pytest.raises(env.ConfigError, match="expected a factor"):
            env.compile_scale()


def test_target_from_env_in_a_fresh_process():
    code = "import torch; torch.ones(1, device='neuron'); print(torch.neuron.get_device_name())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NEURON_SIM_TARGET": "trn1", "LOCAL_RANK": "1"},
    )
    assert "trn1" in out.stdout and "core 1" in out.stdout


def test_memory_accounting_and_out_of_memory():
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    t = torch.empty(1024, 1024, device="neuron")
    assert torch.neuron.memory_allocated() - base >= 4 * 1024 * 1024
    assert torch.neuron.max_memory_allocated() >= torch.neuron.memory_allocated()
    view = t[0]
    del t
    assert torch.neuron.memory_allocated() - base >= 4 * 1024 * 1024, "a view keeps the storage"
    del view
    assert torch.neuron.memory_allocated() == base
    capacity = torch.neuron.memory_stats()["capacity_bytes"]
    with pytest.raises(torch.OutOfMemoryError, match="capacity") as e:
        torch.empty(capacity // 4 + 1, dtype=torch.float32, device="neuron")
    assert str(capacity) in str(e.value)
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    torch.neuron.empty_cache()


def test_storages_over_the_same_memory_each_give_their_block_back():
    """The runtime finds a storage's record by its data_ptr (client/core/device_memory.py):
    two device storages over the same host memory still each free their HBM when they die."""
    from trnsim.client.core import runtime
    from trnsim.client.core.memory import to_device

    memory = runtime.get().memory
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    host = torch.arange(6.0)
    first = memory.adopt(to_device(host), memory.allocate(24), host)
    second = memory.adopt(to_device(host), memory.allocate(24), host)
    assert first.data_ptr() == second.data_ptr()
    assert torch.neuron.memory_allocated() - base == 1024  # (two blocks of 512 bytes)
    assert torch.equal((first + second).cpu(), host * 2)
    del first
    assert torch.neuron.memory_allocated() - base == 512
    del second
    assert torch.neuron.memory_allocated() == base


def test_an_input_read_twice_counts_once_in_the_per_op_hbm_check() -> None:
    """a * a needs the memory of a and of its result, as a + 1 does: one input, read twice."""
    from trnsim.client.core import runtime

    a = torch.randn(333, 77, device="neuron")
    b = torch.randn(333, 77, device="neuron")
    options = runtime.get().executables.options
    options.hbm_budget_bytes = int(2.5 * a.nbytes)
    try:
        assert torch.equal((a * a).cpu(), a.cpu() * a.cpu())
        assert torch.equal(torch.addcmul(a, a, a).cpu(), torch.addcmul(*[a.cpu()] * 3))
        with pytest.raises(torch.OutOfMemoryError, match="over the budget"):
            torch.addcmul(a, b, a)  # two tensors and a result: more than the budget
    finally:
        options.hbm_budget_bytes = 0


def test_manual_seed_makes_random_ops_repeatable():
    torch.neuron.manual_seed(123)
    a = torch.randn(5, device="neuron").cpu()
    torch.manual_seed(123)  # calls torch.neuron.manual_seed_all
    b = torch.randn(5, device="neuron").cpu()
    assert torch.equal(a, b)
    assert not torch.equal(torch.randn(5, device="neuron").cpu(), b)


def test_errors_name_the_op_and_the_users_line():
    a = torch.ones(2, 3, device="neuron")
    b = torch.ones(4, 5, device="neuron")
    with pytest.raises(RuntimeError) as e:
        a @ b
    assert "mm" in str(e.value) or "shapes cannot be multiplied" in str(e.value)
    idx = torch.tensor([0, 7]).to("neuron")
    with pytest.raises(IndexError) as e:
        torch.ones(3, device="neuron")[idx].cpu()
    assert "test_device.py" in str(e.value) and "aten::index" in str(e.value)


def test_deepcopy_state_dict_and_save_load(tmp_path):
    model = torch.nn.Linear(3, 2).to("neuron")
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "neuron"
    assert torch.equal(clone.weight.cpu(), model.weight.cpu())
    assert clone.weight.data_ptr() != model.weight.data_ptr()
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    loaded = torch.load(path)
    assert loaded["weight"].device.type == "neuron"
    assert torch.equal(loaded["weight"].cpu(), model.weight.cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["weight"].device.type == "cpu"
    buf = io.BytesIO()
    torch.save(torch.arange(4.0), buf)
    buf.seek(0)
    assert torch.load(buf, map_location="neuron").device.type == "neuron"
    fresh = torch.nn.Linear(3, 2).to("neuron")
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh.bias.cpu(), model.bias.cpu())


def test_histc_takes_integers_as_cuda_does():
    """Mixtral's routing (transformers) counts expert ids with histc on an int tensor."""
    ids = torch.tensor([0, 1, 1, 3, 2, 3, 3], dtype=torch.int32)
    got = torch.histc(ids.to("neuron"), bins=4, min=0, max=3)
    assert got.dtype == torch.int32
    assert got.cpu().tolist() == [1, 2, 1, 3]


def test_reset_metrics_zeroes_every_counter_and_the_clocks_go_on():
    """torch.neuron.reset_metrics() zeroes what metrics() counts, from the runtime and the
    timeline alike (launches and sync waits included); host and wall time are clocks."""
    x = torch.ones(64, 64, device="neuron")
    (x @ x).sum().item()
    before = torch.neuron.metrics()
    assert before["launches"] > 0 and before["sync_waits"] > 0
    torch.neuron.reset_metrics()
    after = torch.neuron.metrics()
    clocks = {"host_ns", "wall_ns"}
    assert {k: v for k, v in after.items() if k not in clocks and v} == {}
    assert after["host_ns"] >= before["host_ns"] and after["wall_ns"] >= before["wall_ns"]
    y = x + 1
    torch.neuron.synchronize()
    again = torch.neuron.metrics()
    assert again["launches"] == 1 and again["sync_waits"] == 1, again
    assert again["device_busy_ns"] > 0 and y.shape == (64, 64)
