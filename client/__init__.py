"""The PyTorch side of trnsim: the `neuron` device, registered on `import torch`."""

from __future__ import annotations


def _autoload() -> None:
    """Entry point (group torch.backends): makes device="neuron" work after `import torch`."""
    from trnsim.client.api import backend

    backend.register()


# torch now (after _autoload, which it calls): `import torch` registers the device, and that
# imports modules of this package. A program whose first import is one of them (`from
# trnsim.client.core.shapes import load`) would otherwise be half-imported when register() asks
# for it, and the device would fail to load.
import torch  # noqa: F401
