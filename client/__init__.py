"""The PyTorch side of trnsim: the `neuron` device, registered on `import torch`."""

from __future__ import annotations


def _autoload() -> None:
    """Entry point (group torch.backends): makes device="neuron" work after `import torch`."""
    from trnsim.client import backend

    backend.register()
