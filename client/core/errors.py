"""Errors the neuron device raises, and where in the user's program an op came from."""

from __future__ import annotations

import os
import sys

import torch
from trnsim.protos import graph_pb2

_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # trnsim/
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP = (_HERE, _TORCH, "<frozen", os.path.dirname(os.__file__))


# Code torch.fx generated (a compiled graph's, client/modes/compiled.py): its file name -> line ->
# the user's (file, line, function) that line's node was traced from.
GENERATED: dict[str, dict[int, tuple[str, int, str]]] = {}


def user_frame() -> tuple[str, int, str]:
    """(file, line, function) of the innermost frame outside torch, trnsim and the stdlib;
    in a compiled graph's generated code, the user's line its op was traced from."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) or "/tests/" in path or "/examples/" in path:
            generated = GENERATED.get(path)
            if generated is None:
                return path, frame.f_lineno, frame.f_code.co_name
            where = generated.get(frame.f_lineno)
            if where is not None:
                return where
            # (a node traced from no user line, as in torch's own modules: the caller's)
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>", 0, ""


def user_location() -> str:
    path, line, _ = user_frame()
    return f"{path}:{line}"


def script_location() -> str:
    """file:line of the innermost frame of the user's own code: outside torch, trnsim, the
    stdlib and installed packages (a model from transformers is called from the script)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) and "-packages/" not in path:
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return user_location()


class DeviceIndexError(RuntimeError):
    """Unrecoverable: each process drives one simulated core, always neuron:0."""


def check_device_index(device: object) -> None:
    index = getattr(device, "index", None)
    if index not in (None, 0):
        raise DeviceIndexError(
            f"{device} is not available: each process drives one simulated NeuronCore, which "
            f"is neuron:0 in the process. Choose the core with LOCAL_RANK (torchrun) or "
            f"NEURON_RT_VISIBLE_CORES and use device 'neuron' or 'neuron:0'."
        )


def out_of_memory(e: Exception) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"neuron: {e}")


def execution_error(op: str, cause: BaseException, where: str | None = None) -> BaseException:
    """The cause's type when it can carry our message (RuntimeError, IndexError...), naming
    the op and the user's line that issued it (default: the line running now)."""
    message = f"{op} failed on the neuron device (issued at {where or user_location()}): {cause}"
    try:
        return type(cause)(message)
    except Exception:  # noqa: BLE001  (an exception type with a different constructor)
        return RuntimeError(message)


def compile_error(debug: graph_pb2.GraphDebug, e: Exception) -> Exception:
    """An op's executable could not be built: OutOfMemoryError when its graph needs more
    device memory than the target has, else a RuntimeError; both name the op and its line."""
    from trnsim.compiler import GraphTooLargeError

    where = debug.node_locations[0] if debug.node_locations else None
    at = f"{where.file}:{where.line}" if where is not None and where.file else user_location()
    if isinstance(e, GraphTooLargeError):
        return torch.OutOfMemoryError(f"neuron: {debug.name} (called at {at}) cannot run: {e}")
    return RuntimeError(f"{debug.name} cannot be compiled for neuron (called at {at}): {e}")
