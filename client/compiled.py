"""Compiled mode: `torch.compile(model, backend="neuron")`.

Dynamo captures the Python; AOTAutograd (torch._functorch) lowers each captured graph to a
functionalized ATen forward graph and, when gradients are needed, a backward graph. Each of
those runs as one compiled region (Runtime.compiled_region): its ops are recorded whole by
the region recorder (client/recorder.py, beside adaptive mode's, over the same op layer), the
region is compiled at the fused level (-O2) through the same compile client — so the daemon
dedupes and caches it across processes — and launched once per call.

What the compiler cannot take splits the region: an op with a data-dependent output shape
or one the compiler does not fuse runs on its own, eagerly, and the rest goes on; dynamo's
own graph breaks leave the Python between graphs to run in the process's eager mode. A
region's first run checks each op signature once on its own (as adaptive mode does), so
the first call of a compiled function runs op by op and the second compiles.

Dynamo recompiles a function when its guards fail (a new shape, a new dtype...); the
reasons are kept per function and shown by `explain()` (`torch.neuron.compiled_explain()`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trnsim.client import runtime

NAME = "neuron"
log = logging.getLogger(__name__)
_warned: list[bool] = []
_fallbacks: list[str] = []  # why graphs ran in the eager mode instead (compiled_explain)

# AOTAutograd's decompositions: none. The chip's compiler takes ATen's ops as they are
# (its op table classifies each onto an engine), and the executor runs each with the CPU's
# own kernel, so a compiled region computes what eager mode computes, op for op.
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


def _skip_in_dynamo() -> None:
    """Dynamo must not trace the backend's own Python (the runtime a compiled function reaches
    through torch.neuron or an optimizer): its frames run as they are. This module is
    imported when torch.compile looks the backend up, before anything is traced."""
    from torch._dynamo import trace_rules

    for package in ("client", "simulator", "compiler", "scheduler", "protos", "daemon"):
        trace_rules.add(f"trnsim.{package}")


_skip_in_dynamo()


def _numpy_random_as_in_eager() -> None:
    """numpy.random calls in compiled code draw from numpy's own stream (dynamo's default
    traces them into torch's generator): a compiled step then draws what the eager one does
    (transformers' wav2vec2 masks time steps with numpy.random)."""
    import torch._dynamo.config

    torch._dynamo.config.use_numpy_random_stream = True


_numpy_random_as_in_eager()


def _region(kind: str, gm: torch.fx.GraphModule) -> Callable[[list[Any]], Any]:
    """The callable AOTAutograd runs for one of its graphs: the graph's ops as one region."""
    run_graph = gm.forward

    def run(args: list[Any]) -> Any:
        flat = list(args)
        args.clear()  # (boxed convention: the graph owns its inputs from here)
        rt = runtime.get()
        rt.count("compiled_calls")
        with rt.compiled_region():
            return run_graph(*flat)

    run._boxed_call = True  # type: ignore[attr-defined]
    run.__name__ = f"neuron_{kind}"
    return run


def _compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        rt = runtime.get()
        rt.count(f"compiled_{kind}_graphs")
        return _region(kind, gm)

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The dynamo backend "neuron" (entry point torch_dynamo_backends)."""
    from torch._dynamo.backends.common import aot_autograd

    rt = runtime.get()
    rt.count("compiled_dynamo_graphs")
    masked = _boolean_mask_indexing(gm)
    if masked:
        # AOTAutograd traces such a graph's backward (IndexPutBackward: a nonzero of the
        # mask) on fake tensors in the autograd engine's device thread, where a Python
        # backend's data-dependent shape is lost as an error and can abort the process.
        _eager(rt, f"boolean-mask indexing at {masked}")
        return gm.forward
    lower = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=DECOMPOSITIONS,
        keep_inference_input_mutations=True,
    )
    try:
        return lower(gm, example_inputs, **kwargs)
    except torch._dynamo.exc.TorchDynamoException:
        raise  # dynamo's own control flow (restarting its analysis, skipping a frame...)
    except Exception as e:  # noqa: BLE001  (never the user's step: this graph runs eagerly)
        first = str(e).splitlines()[0][:200] if str(e) else ""
        _eager(rt, f"{type(e).__name__}: {first}")
        return gm.forward


def _eager(rt: runtime.Runtime, why: str) -> None:
    """A graph that runs in the process's eager mode instead of compiled (counted, said
    once): dynamo's captured graph itself, called op by op."""
    rt.count("compiled_fallbacks")
    _fallbacks.append(why)
    if not _warned:
        _warned.append(True)
        log.warning(
            "torch.compile(backend='neuron'): a graph runs in the eager mode instead (%s); "
            "counter compiled_fallbacks, reasons in torch.neuron.compiled_explain()",
            why,
        )


def _boolean_mask_indexing(gm: torch.fx.GraphModule) -> str:
    """Where the graph indexes a tensor with a boolean mask (x[mask], x[mask] = v) and
    needs its gradient: the source line, or "" if it does not."""
    import operator

    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (operator.getitem, operator.setitem):
            continue
        args = node.args
        if len(args) < 2:
            continue
        base, index = args[0], args[1]
        base_value = getattr(base, "meta", {}).get("example_value")
        indices = index if isinstance(index, (tuple, list)) else (index,)
        for i in indices:
            value = getattr(i, "meta", {}).get("example_value")
            if (
                isinstance(value, torch.Tensor)
                and value.dtype == torch.bool
                and isinstance(base_value, torch.Tensor)
                and base_value.requires_grad
            ):
                return str(node.meta.get("stack_trace", "")).strip().splitlines()[-2:][0].strip()
    return ""


def explain() -> list[dict[str, Any]]:
    """Why compiled functions recompiled: for each one dynamo recompiled, its name, file and
    line, and the guard failures that caused each recompile (dynamo's own reasons); then
    each graph that runs in the eager mode instead of compiled, and why."""
    from torch._dynamo.utils import guard_failures

    out: list[dict[str, Any]] = [{"eager_fallback": why} for why in _fallbacks]
    for code, reasons in guard_failures.items():
        out.append(
            {
                "function": code.co_name,
                "where": f"{code.co_filename}:{code.co_firstlineno}",
                "recompiles": len(reasons),
                "reasons": [str(r) for r in reasons],
            }
        )
    return out
