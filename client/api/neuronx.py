"""The Hugging Face stack finds the neuron device by itself, as on a TorchNeuron host.

accelerate (1.15) and transformers already know TorchNeuron: device "neuron", process group
backend "neuron", `torch.neuron.current_device()`. They take that path when a module named
`torch_neuronx` can be found (`importlib.util.find_spec`), and use nothing of it. So the
device registers a stand-in `torch_neuronx`, found by a finder placed *last* on
sys.meta_path: any real torch_neuronx installed on sys.path is found first, so the
stand-in never shadows it (on a real host the real package wins). The stand-in says what it
is (`torch_neuronx.__trnsim__`) and holds nothing else; code that needs the real package's
API gets an AttributeError naming it.

Then `transformers.Trainer` and `accelerate.Accelerator()` put the model on `neuron:0` with
nothing set, and `accelerate launch --multi_gpu --num_processes N` runs N processes over
the `neuron` process group.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

NAME = "torch_neuronx"


class _StandIn(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = (
            "trnsim's stand-in for torch-neuronx: it tells accelerate and transformers that "
            "the neuron device is here (the simulated one). It has none of torch-neuronx's API."
        )
        module.__version__ = "0.0.0+trnsim"  # type: ignore[attr-defined]
        module.__trnsim__ = True  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    """Answers for torch_neuronx only, and only after every other finder has not."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != NAME:
            return None
        return importlib.machinery.ModuleSpec(NAME, _StandIn(), origin="trnsim (stand-in)")


def install() -> None:
    """Once per process (the device's registration, at `import torch`)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
