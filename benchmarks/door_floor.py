"""The floor of a PrivateUse1 kernel in C++, against trnsim's Python door and the CPU.

    python benchmarks/door_floor.py [--number 50000] [--repeat 5]

What a small op could cost if the door were C++: it builds (torch.utils.cpp_extension, about
20 s the first time, cached after in ~/.cache/torch_extensions) a C++ kernel for
`aten::add.Tensor` on neuron tensors that does only what cannot be skipped (the inputs'
host aliases, the CPU's add, the output as a neuron tensor over the CPU result's memory)
and none of trnsim's accounting (no signature, no HBM block, no launch), then times
`torch.add` of two tensors of 16 floats: trnsim's door first (the C++ door when it is built,
client/door/fast.py, else the Python door), then, in the same process, that kernel
registered in its place, then the CPU. The kernel replaces trnsim's
for the rest of the process (PyTorch warns that it overrides a kernel): run it as its own
command. Needs g++ and ninja.
"""

from __future__ import annotations

import argparse
import os
import timeit
import warnings

os.environ.setdefault("NEURON_COMPILE_DAEMON", "off")

import torch

SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>

static const c10::Device kNeuron(c10::DeviceType::PrivateUse1, 0);

// A CPU tensor over a neuron tensor's memory (both are host memory in trnsim).
static at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [](void*) {},
                       t.options().device(at::kCPU));
}

// A neuron tensor over a CPU tensor's memory, keeping its storage alive.
static at::Tensor to_device(const at::Tensor& cpu) {
  auto* keep = new c10::Storage(cpu.storage());
  return at::for_blob(cpu.data_ptr(), cpu.sizes())
      .strides(cpu.strides())
      .deleter([keep](void*) { delete keep; })
      .options(cpu.options().device(kNeuron))
      .target_device(kNeuron)
      .make_tensor();
}

static at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return to_device(at::add(host_alias(a), host_alias(b), alpha));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("add.Tensor", TORCH_FN(add)); }
"""


def _us(statement: str, scope: dict[str, object], number: int, repeat: int) -> float:
    return min(timeit.repeat(statement, globals=scope, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings (the best is kept)")
    args = parser.parse_args()
    a, b = torch.randn(16), torch.randn(16)
    scope: dict[str, object] = {"torch": torch, "a": a, "b": b}
    scope["an"], scope["bn"] = a.to("neuron"), b.to("neuron")
    torch.add(scope["an"], scope["bn"])  # (compiled: the warm path is timed)
    door = _us("torch.add(an, bn)", scope, args.number, args.repeat)
    from trnsim.client.door import fast

    which = "C++ door" if fast.module() is not None else "Python"
    print("building the C++ kernel (about 20 s the first time)...", flush=True)
    from torch.utils.cpp_extension import load_inline

    with warnings.catch_warnings():  # (it overrides a kernel: PyTorch warns, as it should)
        warnings.simplefilter("ignore")
        load_inline("trnsim_door_floor", cpp_sources=[SOURCE], is_python_module=False)
    result = torch.add(scope["an"], scope["bn"])
    assert result.device.type == "neuron" and torch.equal(result.cpu(), a + b)
    floor = _us("torch.add(an, bn)", scope, args.number, args.repeat)
    cpu = _us("torch.add(a, b)", scope, args.number, args.repeat)
    print(f"{'add (16,)':<40} {'us':>7} {'x CPU':>7}")
    for name, us in (
        (f"trnsim's door ({which}, warm)", door),
        ("a C++ kernel: aliases, CPU add, output", floor),
        ("CPU", cpu),
    ):
        print(f"{name:<40} {us:>7.2f} {us / cpu:>7.2f}")


if __name__ == "__main__":
    main()
