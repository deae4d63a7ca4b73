"""PyTorch's own OpInfo database, float32 forward samples, on neuron vs CPU.

    python tests/conformance.py [--ops add,mm,...] [--timeout 60] [--mode adaptive]

Prints one line per failing op with the reason, then `N passed, M failed`. An op passes
when every float32 sample gives the CPU's result (values, dtype, shape). Ops listed in
NOT_COMPARABLE run but are compared on shape and dtype only, with the reason printed.

--mode adaptive: each sample also runs REPEATS times in adaptive mode (recorded, and fused
once its graph's compile is in) and must give eager mode's result bit for bit.
--mode compiled: the first COMPILED_SAMPLES samples of each op also run wrapped in a function
compiled with torch.compile(backend="neuron"), three calls each, against the CPU.

--forward-ad: instead, every op that supports forward-mode AD (OpInfo supports_forward_ad):
each float32 sample with dual inputs (random tangents, the same on both devices), its outputs
and their tangents on neuron against the CPU's; in the current eager mode (--mode eager or
adaptive; adaptive also against eager, bit for bit).
--gradgrad: instead, every op that supports double backward (supports_gradgrad): each sample's
gradient, taken with create_graph, differentiated again; both on neuron against the CPU's.
--sparse: instead, every op with sparse samples (supports_sparse, _csr, _csc, _bsr, _bsc):
each float32 sample of each sparse layout on neuron against the CPU (results compared as
dense tensors, and on their layout); in adaptive mode too, against eager, bit for bit.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

# Random ops: their values come from the device's own generator (as on CUDA), so only
# shapes and dtypes can be compared with the CPU's.
NOT_COMPARABLE = {
    name: "random numbers from the neuron generator differ from the CPU generator's"
    for name in (
        "bernoulli",
        "normal",
        "normal_number_mean",
        "normal_in_place",
        "uniform",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout",
        "nn.functional.rrelu",
        "rand_like",
        "randn_like",
        "randint_like",
        "randint",
        "multinomial",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_permuted",
        "nn.functional.multi_head_attention_forward",
        "torch._scaled_mm",
    )
}


# Ops whose results are uninitialised memory: adaptive and eager are compared on shape,
# dtype and strides only.
UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
UNINITIALIZED |= {"empty_permuted"}
REPEATS = 4  # adaptive: first sight runs on its own, second op by op, then fused


# Ops known to fail, and why; they still run (and are reported) every time.
EXPLAINED = {
    "as_strided.partial_views": (
        "moving a view to a device copies only its elements, so as_strided over the rest of "
        "the CPU storage has nothing to read (the same on CUDA)"
    ),
    "nn.functional.scaled_dot_product_attention": (
        "the neuron path takes PyTorch's math attention, the CPU its flash kernel: results "
        "differ by ~1e-5 in a few elements"
    ),
    "tensor_split": "the split indices must be a CPU tensor (as on CUDA); the sample moves them",
    "histogramdd": "torch.histogramdd takes CPU bins only; the sample moves them",
    "nn.functional.max_unpool2d": (
        "forward-mode AD: its tangents scatter through duplicate indices in any order, so the "
        "CPU does not repeat its own result (PyTorch's TestFwdGradients skips it for that)"
    ),
}


@dataclass
class Result:
    name: str
    passed: bool
    samples: int
    reason: str = ""
    eager_fallbacks: int = 0  # compiled mode: graphs of the op that ran eagerly instead


class _Timeout(Exception):
    pass


class AdaptiveModeError(AssertionError):
    """A sample right in eager mode failed or differed in adaptive mode."""


def _to_neuron(x: Any) -> Any:
    """Tensors move to neuron; a device argument (factories) names neuron instead of cpu."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("neuron")
    if isinstance(x, torch.device) and x.type == "cpu" or x == "cpu":
        return torch.device("neuron")
    return x


def _moved(sample: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """The sample on neuron, or None when nothing in it names a device (such a factory call
    makes CPU tensors whatever the backend)."""
    original = (sample.input, tuple(sample.args), dict(sample.kwargs))
    moved = tree_map(_to_neuron, original)
    touched = [
        a is not b for a, b in zip(tree_flatten(original)[0], tree_flatten(moved)[0], strict=True)
    ]
    return moved if any(touched) else None


def _compare(expected: Any, actual: Any, values: bool, moved: bool = False) -> None:
    """actual (on neuron; `moved`: already brought to the CPU) against expected."""
    if expected is None:
        assert actual is None, f"expected no tensor, got {type(actual).__name__}"
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
        if not moved and actual.device.type != "neuron" and expected.device.type == "cpu":
            raise AssertionError(f"result on {actual.device}, expected neuron")
        got = actual.detach().cpu()
        if not values:
            assert got.shape == expected.shape and got.dtype == expected.dtype, (
                got.shape,
                expected.shape,
            )
            return
        torch.testing.assert_close(got, expected.detach(), equal_nan=True, rtol=1.3e-6, atol=1e-5)
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            _compare(e, a, values, moved)
    elif isinstance(expected, float) and values:
        both_nan = math.isnan(expected) and math.isnan(actual)
        assert both_nan or abs(expected - actual) <= 1e-5 + 1.3e-6 * abs(expected)
    elif values:
        assert expected == actual, (expected, actual)


def _layout(value: Any) -> Any:
    """Shapes, strides and dtypes of the tensors in a result."""
    flat, _ = tree_flatten(value)
    return [(t.shape, t.stride(), t.dtype) for t in flat if isinstance(t, torch.Tensor)]


def _run_moved(op: Any, sample: Any) -> Any:
    """The sample once more, on neuron in the current mode, its result on the CPU."""
    from tests.client.differential import to_cpu

    dev_input, dev_args, dev_kwargs = _moved(sample)  # type: ignore[misc]
    torch.manual_seed(0)
    return to_cpu(op(dev_input, *dev_args, **dev_kwargs))


def _same_as_eager(op: Any, sample: Any) -> None:
    """The sample in eager mode twice, then REPEATS times in adaptive mode: bit for bit the
    same. New memory is NaN-filled (deterministic algorithms, warn only) so that outputs a
    kernel leaves unwritten compare equal; ops whose eager runs still differ from each other
    (a CPU kernel reading uninitialised workspace) are compared on layout only."""
    from trnsim.client.core import runtime

    from tests.client.differential import same_bits, wait_for_fused_compiles

    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        eager = _run_moved(op, sample)
        bits = op.name not in UNINITIALIZED and same_bits(eager, _run_moved(op, sample))
        torch.neuron.set_eager_mode("adaptive")
        for k in range(REPEATS):
            got = _run_moved(op, sample)
            wait_for_fused_compiles(runtime.get())
            if bits:
                assert same_bits(eager, got), f"repetition {k}: adaptive differs from eager"
            else:
                assert _layout(eager) == _layout(got), f"repetition {k}: adaptive's layout"
    finally:
        torch.neuron.set_eager_mode("eager")
        torch.use_deterministic_algorithms(deterministic)


class CompiledModeError(AssertionError):
    """A sample right in eager mode failed or differed under torch.compile(backend="neuron")."""


COMPILED_SAMPLES = 3  # samples per op under compile (each one a dynamo and AOT compile)


def _compiled_as_cpu(op: Any, sample: Any, expected: Any, values: bool) -> int:
    """The sample's op wrapped in a function compiled with the neuron backend, called three
    times (each op's first sight, the region's compile, the fused run): each result must
    match the CPU's as eager mode's must."""
    dev_input, dev_args, dev_kwargs = _moved(sample)  # type: ignore[misc]

    def call(x: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return op(x, *args, **kwargs)

    torch._dynamo.reset()
    compiled = torch.compile(call, backend="neuron")
    before = torch.neuron.metrics()["compiled_fallbacks"]
    for _ in range(3):
        torch.manual_seed(0)
        _compare(expected, compiled(dev_input, dev_args, dev_kwargs), values)
    return int(torch.neuron.metrics()["compiled_fallbacks"] - before)


def run_op(op: Any, timeout: int, mode: str = "eager", check: str = "forward") -> Result:
    """One op's float32 samples on neuron against the CPU: its forward (check "forward"),
    its forward-mode derivatives ("forward_ad") or its double backward ("gradgrad")."""
    if check != "forward":
        return _run_derivatives(op, timeout, mode, check)
    name = _name(op)
    values = op.name not in NOT_COMPARABLE
    fallbacks = [0]

    def run(done: list[int]) -> None:
        for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
            try:
                torch.manual_seed(0)
                expected = op(sample.input, *sample.args, **sample.kwargs)
            except Exception:  # noqa: BLE001, S112  (the CPU rejects this sample: not ours to test)
                continue
            moved = _moved(sample)
            if moved is None:
                continue
            dev_input, dev_args, dev_kwargs = moved
            torch.manual_seed(0)
            actual = op(dev_input, *dev_args, **dev_kwargs)
            _compare(expected, actual, values)
            if mode == "adaptive":
                try:
                    _same_as_eager(op, sample)
                except Exception as e:
                    raise AdaptiveModeError(f"adaptive mode: {type(e).__name__}: {e}") from e
            if mode == "compiled" and done[0] < COMPILED_SAMPLES:
                try:
                    fallbacks[0] += _compiled_as_cpu(op, sample, expected, values)
                except Exception as e:
                    raise CompiledModeError(f"compiled mode: {type(e).__name__}: {e}") from e
            done[0] += 1

    count, failure = _guarded(name, timeout, run)
    if failure is not None:
        return failure
    return Result(name, True, count, "" if values else NOT_COMPARABLE[op.name], fallbacks[0])


def _name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _guarded(
    name: str, timeout: int, run: Callable[[list[int]], None]
) -> tuple[int, Result | None]:
    """run(done) under a deadline, warnings silenced (samples trigger deprecation and
    performance warnings): the samples it finished (done[0]) and, if it failed or ran out of
    time, the failing Result."""
    done = [0]

    def alarm(*_: object) -> None:
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore")
    try:
        run(done)
    except _Timeout:
        return done[0], Result(name, False, done[0], f"over the {timeout} s limit")
    except Exception as e:  # noqa: BLE001  (reported per op)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return done[0], Result(name, False, done[0], f"{type(e).__name__}: {first[:200]}")
    finally:
        caught.__exit__(None, None, None)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return done[0], None


def float32_ops(names: Iterable[str] | None = None, check: str = "forward") -> list[Any]:
    """The OpInfo entries with float32 samples (the named ones), and for a derivative check
    those that support it."""
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(names) if names else None
    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if check == "forward_ad":
        ops = [o for o in ops if o.supports_forward_ad]
    elif check == "sparse":
        ops = [o for o in ops if _sparse_layouts(o)]
    elif check == "gradgrad":
        ops = [o for o in ops if o.supports_gradgrad and o.supports_autograd]
    if wanted is not None:
        ops = [o for o in ops if o.name in wanted]
    return ops


# -- derivatives: forward-mode AD and double backward ---------------------------------------------
TANGENT_SEED = 1234


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.requires_grad


def _on(device: str, x: Any) -> Any:
    """A leaf of a sample on `device`, detached; differentiable ones require grad again."""
    if isinstance(x, torch.Tensor):
        moved = x.detach().to(device)
        return moved.requires_grad_() if _differentiable(x) else moved
    if device == "neuron" and (isinstance(x, torch.device) and x.type == "cpu" or x == "cpu"):
        return torch.device("neuron")
    return x


def _random_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random values of t's shape in t's layout (a tangent must match its primal's strides)."""
    out = torch.empty_like(t.detach().cpu())
    return out.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))


def _forward_ad(op: Any, sample: Any, device: str) -> list[Any]:
    """The op's outputs and their tangents, every differentiable input a dual tensor."""
    import torch.autograd.forward_ad as fw

    g = torch.Generator().manual_seed(TANGENT_SEED)
    tree = tree_map(lambda x: _on(device, x), (sample.input, tuple(sample.args), sample.kwargs))
    with fw.dual_level():

        def dual(x: Any) -> Any:
            if not _differentiable(x):
                return x
            return fw.make_dual(x.detach(), _random_like(x, g).to(device))

        x, args, kwargs = tree_map(dual, tree)
        torch.manual_seed(0)
        flat, _ = tree_flatten(op(x, *args, **kwargs))
        out: list[Any] = []
        for o in flat:
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                primal, tangent = fw.unpack_dual(o)
                out += [primal.detach().cpu(), None if tangent is None else tangent.cpu()]
            elif isinstance(o, torch.Tensor):
                out.append(o.cpu())
        return out


def _gradgrad(op: Any, sample: Any, device: str) -> list[Any]:
    """The op's gradient (random output gradients, create_graph) differentiated again against
    random weights: the second derivatives reach every differentiable input."""
    g = torch.Generator().manual_seed(TANGENT_SEED)
    x, args, kwargs = tree_map(
        lambda v: _on(device, v), (sample.input, tuple(sample.args), sample.kwargs)
    )
    inputs = [t for t in tree_flatten((x, args, kwargs))[0] if _differentiable(t)]
    torch.manual_seed(0)
    outs = [o for o in tree_flatten(op(x, *args, **kwargs))[0] if _differentiable(o)]
    if not inputs or not outs:
        return []
    vs = [_random_like(o, g).to(device) for o in outs]
    grads = torch.autograd.grad(outs, inputs, vs, create_graph=True, allow_unused=True)
    alive = [(gr, _random_like(gr, g).to(device)) for gr in grads if _differentiable(gr)]
    if not alive:
        return [None if gr is None else gr.detach().cpu() for gr in grads]
    total = sum((gr * w).sum() for gr, w in alive)
    second = torch.autograd.grad(total, inputs, allow_unused=True)  # type: ignore[arg-type]
    firsts = [None if gr is None else gr.detach().cpu() for gr in grads]
    return firsts + [None if s is None else s.detach().cpu() for s in second]


SPARSE_LAYOUTS = {
    "supports_sparse": torch.sparse_coo,
    "supports_sparse_csr": torch.sparse_csr,
    "supports_sparse_csc": torch.sparse_csc,
    "supports_sparse_bsr": torch.sparse_bsr,
    "supports_sparse_bsc": torch.sparse_bsc,
}


def _sparse_layouts(op: Any) -> list[Any]:
    return [layout for attr, layout in SPARSE_LAYOUTS.items() if getattr(op, attr, False)]


def _sparse_samples(op: Any) -> Iterable[Any]:
    """Every sparse sample of the op, layout by layout (a layout without samples: none)."""
    import unittest

    for layout in _sparse_layouts(op):
        try:
            yield from op.sample_inputs_sparse(layout, "cpu", torch.float32)
        except (NotImplementedError, unittest.SkipTest):
            # OpInfo has no sparse sample function for this op: its dense samples with the
            # input made sparse, as PyTorch's own test_sparse_unary_ufuncs does.
            yield from _made_sparse(op, layout)


def _made_sparse(op: Any, layout: Any) -> Iterable[Any]:
    blocks = {torch.sparse_bsr: (1, 1), torch.sparse_bsc: (1, 1)}
    for sample in op.sample_inputs("cpu", torch.float32):
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.numel():
            continue
        x = x.masked_fill(x.abs() < 0.5, 0)  # (some zeros, so that the tensor is sparse)
        try:
            sparse = x.to_sparse(layout=layout, blocksize=blocks.get(layout))
        except (RuntimeError, TypeError, ValueError):
            continue
        yield type(sample)(sparse, args=sample.args, kwargs=sample.kwargs)


def _dense(value: Any) -> Any:
    """A result on the CPU with its sparse tensors as (layout, dense values)."""

    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.detach().cpu()
        return (str(x.layout), x.to_dense()) if x.layout != torch.strided else x

    return tree_map(one, value)


def _same(a: Any, b: Any) -> bool:
    from tests.client.differential import same_bits

    return same_bits(a, b)


def _sparse_result(op: Any, sample: Any, device: str) -> Any:
    x, args, kwargs = tree_map(
        lambda v: _on(device, v), (sample.input, tuple(sample.args), sample.kwargs)
    )
    torch.manual_seed(0)
    return _dense(op(x, *args, **kwargs))


def _run_derivatives(op: Any, timeout: int, mode: str, check: str) -> Result:
    """Every float32 sample's derivatives (check "forward_ad" or "gradgrad"), or every sparse
    sample's result ("sparse"), on neuron against the CPU's; in adaptive mode also against
    eager mode's, bit for bit."""
    from trnsim.client.core import runtime

    from tests.client.differential import same_bits, wait_for_fused_compiles

    name = _name(op)
    values = op.name not in NOT_COMPARABLE
    derive = {"forward_ad": _forward_ad, "gradgrad": _gradgrad, "sparse": _sparse_result}[check]
    samples = (
        _sparse_samples(op)
        if check == "sparse"
        else op.sample_inputs("cpu", torch.float32, requires_grad=True)
    )

    def run(done: list[int]) -> None:
        for sample in samples:
            try:
                expected = derive(op, sample, "cpu")
            except Exception:  # noqa: BLE001, S112  (the CPU rejects this sample: not ours to test)
                continue
            # A sample the CPU does not repeat bit for bit (max_unpool's duplicate indices
            # scatter in any order) is compared on shapes and dtypes only.
            repeatable = values and _same(expected, derive(op, sample, "cpu"))
            _compare(expected, derive(op, sample, "neuron"), repeatable, moved=True)
            if mode == "adaptive":
                eager = derive(op, sample, "neuron")
                torch.neuron.set_eager_mode("adaptive")
                try:
                    for k in range(REPEATS):
                        got = derive(op, sample, "neuron")
                        wait_for_fused_compiles(runtime.get())
                        if values and not same_bits(eager, got):
                            raise AdaptiveModeError(f"repetition {k}: adaptive differs from eager")
                finally:
                    torch.neuron.set_eager_mode("eager")
            done[0] += 1

    count, failure = _guarded(name, timeout, run)
    if failure is not None:
        return failure
    if count == 0:
        return Result(name, True, 0, "no samples")
    return Result(name, True, count, "" if values else NOT_COMPARABLE[op.name])


def _worker(names: list[str], start: int, timeout: int, mode: str, check: str) -> None:
    """Runs ops from index `start`, one JSON line per op; the parent survives our crashes."""
    import json

    ops = float32_ops(names or None, check)
    for op in ops[start:]:
        print(
            json.dumps(
                {"start": op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")}
            ),
            flush=True,
        )
        r = run_op(op, timeout, mode, check)
        print(json.dumps(r.__dict__), flush=True)


def run_all(
    names: list[str], timeout: int, progress: bool, mode: str = "eager", check: str = "forward"
) -> list[Result]:
    """All ops in worker processes: an op that crashes the process fails alone."""
    import json
    import subprocess

    total = len(float32_ops(names or None, check))
    results: list[Result] = []
    while len(results) < total:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--start",
            str(len(results)),
            "--timeout",
            str(timeout),
            "--ops",
            ",".join(names),
            "--mode",
            mode,
            "--check",
            check,
        ]
        with subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        ) as proc:
            current = None
            assert proc.stdout is not None
            for line in proc.stdout:
                msg = json.loads(line)
                if "start" in msg:
                    current = msg["start"]
                    if progress:
                        print(f"... {current}", file=sys.stderr, flush=True)
                else:
                    results.append(Result(**msg))
                    current = None
        code = proc.wait()
        if current is not None:  # the worker died inside this op
            results.append(Result(current, False, 0, f"crashed the process (exit code {code})"))
        elif len(results) < total:
            raise RuntimeError(f"conformance worker exited with {code} between ops")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per op")
    parser.add_argument("--progress", action="store_true", help="name each op on stderr")
    parser.add_argument(
        "--mode",
        choices=("eager", "adaptive", "compiled"),
        default="eager",
        help="adaptive: also check every sample in adaptive mode against eager, bit for bit; "
        "compiled: also run the first samples of each op under torch.compile(backend='neuron')",
    )
    checks = parser.add_mutually_exclusive_group()
    checks.add_argument(
        "--forward-ad",
        dest="check",
        action="store_const",
        const="forward_ad",
        help="check forward-mode derivatives (dual tensors) of every op that supports them",
    )
    checks.add_argument(
        "--sparse",
        dest="check",
        action="store_const",
        const="sparse",
        help="check every op's sparse samples (COO, CSR, CSC, BSR, BSC)",
    )
    checks.add_argument(
        "--gradgrad",
        dest="check",
        action="store_const",
        const="gradgrad",
        help="check double backward of every op that supports it",
    )
    parser.add_argument("--check", dest="check", help=argparse.SUPPRESS)
    parser.set_defaults(check="forward")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # OpInfo samples trigger many deprecation warnings
    names = [n for n in args.ops.split(",") if n]
    if args.worker:
        _worker(names, args.start, args.timeout, args.mode, args.check)
        return 0
    if args.check != "forward" and args.mode == "compiled":
        parser.error("--forward-ad, --gradgrad and --sparse run in eager or adaptive mode")
    start = time.time()
    results = run_all(names, args.timeout, args.progress, args.mode, args.check)
    failed = [r for r in results if not r.passed]
    for r in failed:
        why = EXPLAINED.get(r.name)
        print(f"FAIL {r.name}: {r.reason}" + (f"  [known: {why}]" if why else ""))
    for r in results:
        if r.passed and r.reason == "no samples":
            print(f"no samples {r.name}: OpInfo gives it none of this kind (not counted)")
        elif r.passed and r.reason:
            print(f"shape/dtype only {r.name}: {r.reason}")
    results = [r for r in results if r.reason != "no samples" or not r.passed]
    passed = len(results) - len(failed)
    if args.mode == "compiled":
        eager = [r.name for r in results if r.eager_fallbacks]
        print(
            f"compiled mode: {len(eager)} of {len(results)} ops had a graph run in the eager "
            f"mode instead of compiled" + (f": {', '.join(eager)}" if eager else "")
        )
    what = {
        "forward": "",
        "forward_ad": ", forward-mode AD",
        "gradgrad": ", double backward",
        "sparse": ", sparse samples",
    }
    print(
        f"{len(results)} ops with float32 samples ({args.mode} mode{what[args.check]}), "
        f"{time.time() - start:.0f} s; "
        f"{100 * passed / max(1, len(results)):.1f} % pass fully"
    )
    print(f"{passed} passed, {len(failed)} failed")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests.client.differential)
    sys.exit(main())
