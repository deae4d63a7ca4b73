"""PyTorch's own OpInfo database, float32 forward samples, on neuron vs CPU.

    python tests/conformance.py [--ops add,mm,...] [--timeout 60] [--mode adaptive]

Prints one line per failing op with the reason, then `N passed, M failed`. An op passes
when every float32 sample gives the CPU's result (values, dtype, shape). Ops listed in
NOT_COMPARABLE run but are compared on shape and dtype only, with the reason printed.

--mode adaptive: each sample also runs REPEATS times in adaptive mode (recorded, and fused
once its graph's compile is in) and must give eager mode's result bit for bit.
--mode compiled: the first COMPILED_SAMPLES samples of each op also run wrapped in a function
compiled with torch.compile(backend="neuron"), three calls each, against the CPU.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
import warnings
from collections.abc import Iterable
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
    "sparse.sampled_addmm": "sparse layouts are not supported on neuron (strided tensors only)",
    "sparse.mm.reduce": "sparse layouts are not supported on neuron (strided tensors only)",
    "to_sparse": "sparse layouts are not supported on neuron (strided tensors only)",
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


def _compare(expected: Any, actual: Any, values: bool) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
        if actual.device.type != "neuron" and expected.device.type == "cpu":
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
            _compare(e, a, values)
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
    from trnsim.client import runtime

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


def run_op(op: Any, timeout: int, mode: str = "eager") -> Result:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    values = op.name not in NOT_COMPARABLE
    count = 0
    fallbacks = 0

    def alarm(*_: object) -> None:
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore")  # samples trigger deprecation and performance warnings
    try:
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
            if mode == "compiled" and count < COMPILED_SAMPLES:
                try:
                    fallbacks += _compiled_as_cpu(op, sample, expected, values)
                except Exception as e:
                    raise CompiledModeError(f"compiled mode: {type(e).__name__}: {e}") from e
            count += 1
    except _Timeout:
        return Result(name, False, count, f"over the {timeout} s limit")
    except Exception as e:  # noqa: BLE001  (reported per op)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return Result(name, False, count, f"{type(e).__name__}: {first[:200]}")
    finally:
        caught.__exit__(None, None, None)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return Result(name, True, count, "" if values else NOT_COMPARABLE[op.name], fallbacks)


def float32_ops(names: Iterable[str] | None = None) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(names) if names else None
    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if wanted is not None:
        ops = [o for o in ops if o.name in wanted]
    return ops


def _worker(names: list[str], start: int, timeout: int, mode: str) -> None:
    """Runs ops from index `start`, one JSON line per op; the parent survives our crashes."""
    import json

    ops = float32_ops(names or None)
    for op in ops[start:]:
        print(
            json.dumps(
                {"start": op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")}
            ),
            flush=True,
        )
        r = run_op(op, timeout, mode)
        print(json.dumps(r.__dict__), flush=True)


def run_all(names: list[str], timeout: int, progress: bool, mode: str = "eager") -> list[Result]:
    """All ops in worker processes: an op that crashes the process fails alone."""
    import json
    import subprocess

    total = len(float32_ops(names or None))
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # OpInfo samples trigger many deprecation warnings
    names = [n for n in args.ops.split(",") if n]
    if args.worker:
        _worker(names, args.start, args.timeout, args.mode)
        return 0
    start = time.time()
    results = run_all(names, args.timeout, args.progress, args.mode)
    failed = [r for r in results if not r.passed]
    for r in failed:
        why = EXPLAINED.get(r.name)
        print(f"FAIL {r.name}: {r.reason}" + (f"  [known: {why}]" if why else ""))
    for r in results:
        if r.passed and r.reason:
            print(f"shape/dtype only {r.name}: {r.reason}")
    passed = len(results) - len(failed)
    if args.mode == "compiled":
        eager = [r.name for r in results if r.eager_fallbacks]
        print(
            f"compiled mode: {len(eager)} of {len(results)} ops had a graph run in the eager "
            f"mode instead of compiled" + (f": {', '.join(eager)}" if eager else "")
        )
    print(
        f"{len(results)} ops with float32 samples ({args.mode} mode), "
        f"{time.time() - start:.0f} s; "
        f"{100 * passed / max(1, len(results)):.1f} % pass fully"
    )
    print(f"{passed} passed, {len(failed)} failed")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests.client.differential)
    sys.exit(main())
