"""Sparse tensors on neuron (client/door/sparse.py): COO and CSR, made, moved, computed on, and
trained with (sparse embedding gradients, SparseAdam, torch.sparse.mm), against the CPU, in
every mode; unsupported ops raise an error that names them; time and memory are accounted."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.client.conftest import EXAMPLES

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
]


def _coo() -> torch.Tensor:
    indices = torch.tensor([[0, 1, 1, 2, 0], [2, 0, 2, 1, 2]])  # (0, 2) twice: uncoalesced
    return torch.sparse_coo_tensor(indices, torch.tensor([3.0, 4.0, 5.0, -1.0, 2.0]), (3, 3))


def _dense(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.to_dense() if x.layout != torch.strided else x
    return x


OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "to_dense": lambda s, d: s.to_dense(),
    "coalesce": lambda s, d: s.coalesce(),
    "scalar_mul": lambda s, d: s * 2.5,
    "add": lambda s, d: s + s,
    "sparse_mm": lambda s, d: torch.sparse.mm(s, d),
    "addmm": lambda s, d: torch.addmm(d, s, d, beta=0.5, alpha=2.0),
    "index_select": lambda s, d: s.index_select(1, torch.tensor([2, 0], device=d.device)),
    "sum": lambda s, d: torch.sparse.sum(s),
    "sum_dim": lambda s, d: torch.sparse.sum(s, dim=1),
    "transpose": lambda s, d: s.t(),
    "to_sparse": lambda s, d: d.to_sparse(),
    "to_sparse_csr": lambda s, d: d.to_sparse_csr(),
    "csr_mm": lambda s, d: d.to_sparse_csr() @ d,
    "sparse_mask": lambda s, d: d.sparse_mask(s.coalesce()),
    "dense_add_sparse": lambda s, d: d + s,
}


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("name", list(OPS))
def test_sparse_ops_equal_the_cpu(name: str, mode: str) -> None:
    d = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    coo = _coo()
    expected = OPS[name](coo, d)
    torch.neuron.set_eager_mode(mode)
    try:
        got = OPS[name](coo.to("neuron"), d.to("neuron"))
        assert isinstance(got, torch.Tensor) and got.device.type == "neuron"
        assert got.layout == expected.layout
        torch.testing.assert_close(_dense(got), _dense(expected), rtol=0, atol=0)
    finally:
        torch.neuron.set_eager_mode("eager")


def test_a_sparse_tensor_is_made_of_device_tensors_and_moves_both_ways() -> None:
    s = _coo().to("neuron")
    assert (s.device.type, s.layout, s.is_sparse) == ("neuron", torch.sparse_coo, True)
    assert s._indices().device.type == "neuron" and s._values().device.type == "neuron"
    assert s._nnz() == 5 and not s.is_coalesced()
    back = s.cpu()
    assert back.device.type == "cpu" and back.layout == torch.sparse_coo
    torch.testing.assert_close(back.to_dense(), _coo().to_dense())
    made = torch.sparse_coo_tensor(
        torch.tensor([[0], [1]], device="neuron"), torch.ones(1, device="neuron"), (2, 2)
    )
    assert made.device.type == "neuron" and made.to_dense().cpu()[0, 1] == 1
    assert "sparse_coo" in repr(s)  # (printing reads its parts from the device)


def test_sparse_ops_are_launches_with_modelled_time_and_hbm() -> None:
    rt_before = torch.neuron.metrics()
    allocated = torch.neuron.memory_allocated()
    s = _coo().to("neuron")
    dense = torch.randn(3, 64, device="neuron")
    out = torch.sparse.mm(s, dense)
    torch.neuron.synchronize()
    after = torch.neuron.metrics()
    assert after["sparse_ops"] - rt_before["sparse_ops"] >= 1
    assert after["device_busy_ns"] > rt_before["device_busy_ns"]
    assert torch.neuron.memory_allocated() > allocated
    del out


def test_an_op_the_cpu_has_no_sparse_kernel_for_names_it() -> None:
    s = _coo().to("neuron")
    with pytest.raises(NotImplementedError, match=r"aten::cumsum .*sparse_coo.*to_dense"):
        torch.cumsum(s, 0)
    assert s.to_dense().sum().item() == pytest.approx(13.0)  # (the process goes on)


def _sparse_models() -> Any:
    sys.path.insert(0, str(EXAMPLES))
    import sparse_models

    return sparse_models


# (model class, its constructor's arguments, its data, its training loop) in the example
SPARSE_MODELS = {
    "dlrm": ("DLRM", (), "dlrm_data", "train_dlrm"),  # sparse embeddings, SparseAdam
    "gcn": ("GCN", (12, 16, 4), "graph_data", "train_gcn"),  # torch.sparse.mm
}


@pytest.mark.parametrize("mode", ["eager", "adaptive", "compiled"])
@pytest.mark.parametrize("name", list(SPARSE_MODELS))
def test_sparse_models_train_as_on_the_cpu(name: str, mode: str) -> None:
    """A DLRM (Embedding and EmbeddingBag with sparse=True, SparseAdam) and a two-layer GCN
    (a sparse adjacency, torch.sparse.mm), 5 steps: the CPU's losses and parameters."""
    models = _sparse_models()
    model_class, arguments, data, train = SPARSE_MODELS[name]
    torch.manual_seed(0)
    model = getattr(models, model_class)(*arguments)
    batch = getattr(models, data)()
    expected, cpu = getattr(models, train)(model, batch, "cpu", "cpu", 5)
    torch._dynamo.reset()
    try:
        got, neuron = getattr(models, train)(model, batch, "neuron", mode, 5)
    finally:
        torch.neuron.set_eager_mode("eager")
    assert got == expected
    assert models.worst_difference(neuron, cpu) == 0.0
    assert all(p.device.type == "neuron" for p in neuron.parameters())


def test_sparse_sgd_on_a_sparse_gradient() -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Embedding(20, 4, sparse=True)
    dev = torch.nn.Embedding(20, 4, sparse=True)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("neuron")
    ids = torch.tensor([1, 3, 3, 7])
    for m, device in ((cpu, "cpu"), (dev, "neuron")):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            m(ids.to(device)).square().sum().backward()
            assert m.weight.grad.is_sparse
            opt.step()
    torch.testing.assert_close(dev.weight.detach().cpu(), cpu.weight.detach(), rtol=0, atol=0)


def test_sparse_ops_are_in_the_profile_with_the_users_line() -> None:
    s, dense = _coo().to("neuron"), torch.randn(3, 8, device="neuron")
    with torch.neuron.profile() as prof:
        torch.sparse.mm(s, dense)
        torch.neuron.synchronize()
    sparse = [e for e in prof.events if e["cat"] == "launch" and "mm" in e["name"]]
    assert sparse, [e["name"] for e in prof.events]
    assert __file__.rsplit("/", 1)[-1] in sparse[0]["args"]["source"]
    assert "dma" in prof.summary()


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "coo": lambda t: t.coalesce(),
    "csr": lambda t: t.to_sparse_csr(),
}
IN_PLACE: dict[str, Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], Any]] = {
    "add_": lambda s, layout: s.add_(layout(_coo()).to(s.device)),
    "add_new_nonzeros": lambda s, layout: s.add_(
        layout(torch.sparse_coo_tensor([[1], [1]], [7.0], (3, 3))).to(s.device)
    ),
    "mul_": lambda s, layout: s.mul_(2.0),
    "zero_": lambda s, layout: s.zero_(),
    "copy_": lambda s, layout: s.copy_(layout(_coo() * 3)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_sparse_ops_change_the_device_tensor_itself(name: str, layout: str) -> None:
    """The CPU's kernel may give the tensor new parts (new nonzeros, none at all): the neuron
    tensor, the same object, takes them."""
    to_layout = LAYOUTS[layout]
    cpu, dev = to_layout(_coo()), to_layout(_coo()).to("neuron")
    IN_PLACE[name](cpu, to_layout)
    assert IN_PLACE[name](dev, to_layout) is dev
    assert dev._nnz() == cpu._nnz() and dev.layout == cpu.layout
    torch.testing.assert_close(dev.to_dense().cpu(), cpu.to_dense(), rtol=0, atol=0)


def test_sparse_gradients_accumulate_across_uses_and_backwards() -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Embedding(10, 3, sparse=True)
    dev = torch.nn.Embedding(10, 3, sparse=True)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("neuron")
    for m, device in ((cpu, "cpu"), (dev, "neuron")):
        ids = torch.tensor([1, 2, 3], device=device)
        (m(ids).sum() + m(ids * 2).square().sum()).backward()
        m(ids).sum().backward()
    assert dev.weight.grad.is_sparse and dev.weight.grad.device.type == "neuron"
    torch.testing.assert_close(
        dev.weight.grad.to_dense().cpu(), cpu.weight.grad.to_dense(), rtol=0, atol=0
    )
