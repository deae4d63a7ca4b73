"""Modules on the device behave as on CUDA: tied parameters stay tied through every
conversion and checkpoint path; lazy modules moved before their first forward materialise
on the device."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch


def _tied():
    emb = torch.nn.Embedding(10, 4)
    lin = torch.nn.Linear(4, 10)
    lin.weight = emb.weight
    head = torch.nn.Linear(4, 10)
    head.bias = lin.bias  # a tied bias too (BERT's decoder)
    return torch.nn.ModuleDict({"e": emb, "l": lin, "h": head})


def _assert_tied(m):
    assert m["e"].weight is m["l"].weight
    assert m["l"].bias is m["h"].bias
    assert len(list(m.parameters())) == 3  # weight, two biases... one of them shared


@pytest.mark.parametrize(
    "convert",
    [
        lambda m: m.to("neuron"),
        lambda m: m.to("neuron").to("cpu"),
        lambda m: m.to("neuron").to(torch.float64),
        lambda m: m.to("neuron").half(),
        lambda m: m.to("neuron", torch.bfloat16),
        lambda m: copy.deepcopy(m.to("neuron")),
    ],
    ids=["to_neuron", "back_to_cpu", "to_dtype", "half", "device_and_dtype", "deepcopy"],
)
def test_model_to_neuron_keeps_tied_parameters_tied(convert):
    m = convert(_tied())
    _assert_tied(m)


def test_tied_parameters_train_like_cpu():
    """One parameter, one gradient: the embedding gets the output layer's share too."""
    torch.manual_seed(0)
    cpu = _tied()
    dev = copy.deepcopy(cpu).to("neuron")
    ids = torch.tensor([1, 2, 3, 7])
    for m, device in ((cpu, "cpu"), (dev, "neuron")):
        x = m["e"](ids.to(device))
        loss = (m["l"](x) + m["h"](x)).square().mean()
        loss.backward()
    torch.testing.assert_close(dev["e"].weight.grad.cpu(), cpu["e"].weight.grad)
    torch.testing.assert_close(dev["h"].bias.grad.cpu(), cpu["h"].bias.grad)


def test_ties_survive_load_state_dict_and_save_load():
    m = _tied().to("neuron")
    m.load_state_dict(_tied().state_dict())
    _assert_tied(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    _assert_tied(loaded)
    assert loaded["e"].weight.device.type == "neuron"


def test_conversions_that_kept_ties_are_untouched():
    """On the CPU, .to(dtype) swaps data in place: the same Parameter objects stay."""
    m = _tied()
    before = [id(p) for p in m.parameters()]
    m.double()
    assert [id(p) for p in m.parameters()] == before
    _assert_tied(m)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # (the CPU's run)
def test_transformer_encoder_in_eval_with_a_padding_mask_declines_nested_tensors():
    """Its fast path builds nested tensors, which neuron does not have: the encoder takes its
    regular path, and the positions that are not padding match the CPU."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=pad)
        device = encoder.to("neuron")
        got = device(x.to("neuron"), src_key_padding_mask=pad.to("neuron")).cpu()
    torch.testing.assert_close(got[~pad], expected[~pad], rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="nested tensors are not supported"):
        torch._nested_tensor_from_mask(x.to("neuron"), (~pad).to("neuron"))


def _lazy_module_infos() -> list[Any]:
    from torch.testing._internal.common_modules import module_db

    return [m for m in module_db if issubclass(m.module_cls, torch.nn.modules.lazy.LazyModuleMixin)]


def _train_once(info: Any, sample: Any, device: str) -> list[torch.Tensor]:
    """The lazy module moved to `device` before its first forward, then one forward and
    backward on the sample: its output, its (materialised) parameters and their gradients."""
    torch.manual_seed(0)
    module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    module = module.to(device)
    assert module.has_uninitialized_params(), "the move initialised the parameters"
    args = [a.detach().to(device) for a in sample.forward_input.args]
    torch.manual_seed(1)  # (the parameters are drawn now, on their device's generator)
    out = module(*args, **sample.forward_input.kwargs)
    out.square().sum().backward()
    params = list(module.parameters())
    got = [out, *params, *(p.grad for p in params)]
    if device != "cpu":
        torch.neuron.synchronize()
    return [t.detach().cpu() for t in got]


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("info", _lazy_module_infos(), ids=lambda m: m.module_cls.__name__)
def test_lazy_modules_materialise_on_the_device(info: Any, mode: str) -> None:
    """Every lazy module PyTorch ships (its ModuleInfo samples), moved to neuron before its
    first forward: the parameters stay uninitialized until then, take their real shapes on the
    device, and the forward, parameters and gradients equal the CPU's."""
    samples = info.module_inputs_func(
        info, device="cpu", dtype=torch.float32, requires_grad=False, training=True
    )
    torch.neuron.set_eager_mode(mode)
    try:
        for sample in samples:
            expected = _train_once(info, sample, "cpu")
            got = _train_once(info, sample, "neuron")
            assert len(got) == len(expected)
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    finally:
        torch.neuron.set_eager_mode("eager")


def test_lazy_module_under_compile() -> None:
    """A lazy module moved to neuron materialises on its first compiled call too."""
    x = torch.randn(2, 3, 8)
    torch.manual_seed(0)
    cpu = torch.nn.LazyConv1d(4, 3)
    expected = cpu(x)
    torch.manual_seed(0)
    module = torch.nn.LazyConv1d(4, 3).to("neuron")
    torch._dynamo.reset()
    got = torch.compile(module, backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(got.cpu(), expected)
    assert module.weight.shape == (4, 3, 3) and module.weight.device.type == "neuron"


def test_a_parameter_moved_to_neuron_stays_the_object_an_optimizer_holds():
    model = torch.nn.Linear(4, 2)
    model.weight.tag = "mine"  # attributes stay, as CUDA's in-place data swap keeps them
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # before the move, as many scripts do
    ids = [id(p) for p in model.parameters()]
    model.to("neuron")
    assert [id(p) for p in model.parameters()] == ids and model.weight.tag == "mine"
    before = model.weight.detach().cpu().clone()
    model(torch.ones(3, 4, device="neuron")).sum().backward()
    opt.step()
    assert not torch.equal(model.weight.detach().cpu(), before), "the optimizer stepped it"
    model.to("cpu")
    assert [id(p) for p in model.parameters()] == ids and model.weight.device.type == "cpu"
