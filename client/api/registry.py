"""The shape registry: every distinct op signature a run dispatches to the device, recorded
to a file, and op-level tests generated from it (TorchNeuron stages its validation this way).

    NEURON_RECORD_SHAPES=ops.jsonl python train.py      # or: trnsim record -o ops.jsonl -- ...
    trnsim registry test ops.jsonl [--mode eager,adaptive] [--ops add,mm] [--per-op K]
    trnsim registry stats ops.jsonl

Recording is client/core/shapes.py (a FILE ending in .gz is read and written compressed). A
test builds random inputs of exactly a signature (integer tensors within the smallest
dimension of the op's float tensors, so that indices are valid) and compares the device with
the CPU in each mode.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from trnsim.client.core.shapes import RegistryFileError, Signature, load
from trnsim.client.core.types import Kwargs, Op, OpValue

RTOL, ATOL = 1.3e-6, 1e-5  # float32 comparisons, as OpInfo's float32 defaults
# Ops whose values come from a generator or uninitialised memory (empty, resize_ growing a
# tensor): compared on shapes and dtypes only.
NOT_COMPARABLE = (
    *("bernoulli", "normal", "uniform", "rand", "randn", "randint", "randperm", "dropout"),
    *("multinomial", "exponential", "geometric", "cauchy", "log_normal"),
    *("empty", "resize_", "new_empty"),
)
# The guard around each input of the CPU's second answer (elements on each side, at least).
GUARD = 256
# Ops that address a tensor's storage from its start (an explicit storage offset): their
# inputs are guarded after their memory only.
ABSOLUTE = frozenset({"as_strided", "as_strided_", "as_strided_copy", "as_strided_scatter", "set_"})


# -- tests from signatures --------------------------------------------------------------------
@dataclass
class Outcome:
    op: str
    status: str  # "pass", "fail", "skip" (the CPU rejects random inputs of this signature, or
    # answers them differently twice: embedding_bag's backward on random bag offsets)
    reason: str = ""


def _resolve(name: str) -> Op:
    from trnsim.simulator.execute import resolve_op

    return resolve_op(name)


def _bound(args: object) -> int:
    """Integer tensors get values below the smallest dimension of the float tensors."""
    dims = [
        s
        for a in _flat(args)
        if isinstance(a, dict) and "tensor" in a and a["dtype"].startswith(("float", "bfloat"))
        for s in a["tensor"]
        if s > 0
    ]
    return min(dims, default=2)


def _flat(value: object) -> Iterable[object]:
    if isinstance(value, list):
        for v in value:
            yield from _flat(v)
    else:
        yield value


def _make(
    value: object, device: str, bound: int, g: torch.Generator, guarded: bool = False
) -> OpValue:
    """The argument again, on `device`: random tensors of the recorded geometry (the same
    values on every device, from one seeded generator)."""
    if isinstance(value, list):
        return [_make(v, device, bound, g, guarded) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return _tensor(value, device, bound, g, guarded)
    if "dtype" in value:
        return getattr(torch, value["dtype"])
    if "device" in value:
        return torch.device(device if value["device"] == "neuron" else value["device"])
    if "memory_format" in value:
        return getattr(torch, value["memory_format"])
    if "layout" in value:
        return getattr(torch, value["layout"])
    if "float" in value:
        return float(value["float"])
    if "complex" in value:  # (each part a number, or {"float": "inf"}...)
        real, imag = (_make(part, device, bound, g) for part in value["complex"])
        return complex(float(real), float(imag))  # type: ignore[arg-type]
    raise ValueError(f"cannot rebuild an argument {value}")


def _tensor(
    meta: dict[str, Any], device: str, bound: int, g: torch.Generator, guarded: bool = False
) -> torch.Tensor:
    """A tensor of the recorded geometry. `guarded`: its memory sits between two guard
    regions of NaN (floats; integers hold 0, a safe index), so an op that reads outside its
    inputs answers differently (see run_signature)."""
    dtype = getattr(torch, meta["dtype"])
    shape, stride, offset = meta["tensor"], meta["stride"], meta["offset"]
    span = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))
    n = span if all(s > 0 for s in shape) else offset
    if dtype == torch.bool:
        flat = torch.rand(n, generator=g) < 0.5
    elif dtype.is_floating_point or dtype.is_complex:
        flat = torch.randn(n, generator=g).to(dtype)
    else:
        flat = torch.randint(0, max(bound, 1), (n,), generator=g).to(dtype)
    target = "cpu" if meta["device"] == "cpu" else device
    if guarded and target == "cpu":
        pad = min(max(n, GUARD), 1 << 20)
        before = 0 if meta.get("absolute") else pad
        memory = torch.full((before + max(n, 0) + pad,), _guard_value(dtype), dtype=dtype)
        memory[before : before + n].copy_(flat)
        return memory.as_strided(shape, stride, offset + before)
    storage = torch.empty(max(n, 0), dtype=dtype, device=target)
    storage.copy_(flat.to(target)) if target != "cpu" else storage.copy_(flat)
    return storage.as_strided(shape, stride, offset)


def _guard_value(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    return 0  # an integer: read as an index, out of range is a crash, not an error


def _build(sig: Signature, device: str, guarded: bool = False) -> tuple[list[OpValue], Kwargs]:
    g = torch.Generator().manual_seed(0)
    bound = _bound([sig.args, list(sig.kwargs.values())])
    absolute = sig.op.split("::")[-1].split(".")[0] in ABSOLUTE
    args = [_make(_absolute(a, absolute), device, bound, g, guarded) for a in sig.args]
    kwargs = {
        k: _make(_absolute(v, absolute), device, bound, g, guarded) for k, v in sig.kwargs.items()
    }
    return args, kwargs


def _absolute(value: object, absolute: bool) -> object:
    """A tensor argument of an op that addresses its storage from its start (as_strided's
    storage_offset): guarded after its memory only, so its storage offset stays the one
    recorded."""
    if absolute and isinstance(value, dict) and "tensor" in value:
        return {**value, "absolute": True}
    if absolute and isinstance(value, list):
        return [_absolute(v, absolute) for v in value]
    return value


def _compare(expected: object, got: object, values: bool) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"a {type(got).__name__} where a tensor was due"
        got = got.detach().cpu()
        assert got.shape == expected.shape and got.dtype == expected.dtype, (
            f"{got.dtype}{list(got.shape)} where {expected.dtype}{list(expected.shape)}"
        )
        if values:
            torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected)
        for e, g in zip(expected, got, strict=True):
            _compare(e, g, values)
    elif values and isinstance(expected, float) and math.isnan(expected):
        assert isinstance(got, float) and math.isnan(got)
    elif values:
        assert expected == got, f"{got!r} where {expected!r}"


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return dst.copy_(src)


def _cpu_reference(op: str) -> Callable[..., OpValue]:
    """What the CPU answers for an op: the op itself, its equivalent for a copy between
    devices, or, for ops with no CPU kernel (the fused RNN cells, integer histc), the
    executor's own kernel called directly (the device's whole path is then what is tested)."""
    from trnsim.simulator.kernels import GAPS

    if op == "aten::_copy_from.default":
        return _copy_from
    return GAPS.get(op) or _resolve(op)


def run_signature(sig: Signature, mode: str) -> Outcome:
    """Random inputs of the signature: the device in `mode` against the CPU."""
    op = _resolve(sig.op)
    values = not any(word in sig.op for word in NOT_COMPARABLE)
    try:
        args, kwargs = _build(sig, "cpu")
        expected = _cpu_reference(sig.op)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (random inputs this op refuses: not a device test)
        return Outcome(sig.op, "skip", f"the CPU rejects random inputs: {_line(e)}")
    if values:  # the CPU once more, its inputs between guard memory: an answer it does not
        # repeat is no reference (the op is not deterministic, or it reads outside its inputs
        # on these random ones: an embedding bag's backward given offsets that are not sorted)
        again, again_kwargs = _build(sig, "cpu", guarded=True)
        try:
            _compare(expected, _cpu_reference(sig.op)(*again, **again_kwargs), values)
        except Exception as e:  # noqa: BLE001  (a guard read as an index is out of range)
            return Outcome(
                sig.op,
                "skip",
                f"the CPU answers random inputs two ways (it is not deterministic, or reads "
                f"outside its inputs): {_line(e)}",
            )
    torch.neuron.set_eager_mode(mode)
    try:
        for _ in range(2 if mode == "adaptive" else 1):  # recorded on second sight
            args, kwargs = _build(sig, "neuron")
            got = op(*args, **kwargs)
            _compare(expected, got, values)
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001  (reported per signature)
        return Outcome(sig.op, "fail", _line(e))
    finally:
        torch.neuron.set_eager_mode("eager")
    return Outcome(sig.op, "pass")


def _line(e: BaseException) -> str:
    """The error in one line; a comparison keeps its details (how many elements differ, the
    greatest difference and where)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    kept = lines[:4] if isinstance(e, AssertionError) else lines[:1]
    return f"{type(e).__name__}: {'; '.join(line[:200] for line in kept)}"


def run_all(signatures: Sequence[Signature], modes: Sequence[str]) -> dict[str, list[Outcome]]:
    """Every signature in every mode. New memory is NaN-filled meanwhile (deterministic
    algorithms, warn only): outputs a kernel leaves partly unwritten (_ctc_loss's log_alpha)
    then compare equal instead of as two heaps of garbage."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {mode: [run_signature(s, mode) for s in signatures] for mode in modes}
    finally:
        torch.use_deterministic_algorithms(deterministic)


# -- the command line -------------------------------------------------------------------------
def stratified(signatures: Sequence[Signature], per_op: int) -> list[Signature]:
    """At most per_op signatures of each op, spread evenly over its signatures in file order
    (the file is sorted, so alike geometries sit together): every op is tested, none
    dominates."""
    by_op: dict[str, list[Signature]] = {}
    for s in signatures:
        by_op.setdefault(s.op, []).append(s)
    chosen = []
    for sigs in by_op.values():
        step = max(1, len(sigs) / per_op)
        chosen += [sigs[int(i * step)] for i in range(min(per_op, len(sigs)))]
    return chosen


def cmd_test(args: argparse.Namespace) -> int:
    signatures = _selected(load(Path(args.file)), args.ops)
    if args.per_op:
        signatures = stratified(signatures, args.per_op)
    start = time.perf_counter()
    results = run_all(signatures, args.mode.split(","))
    seconds = time.perf_counter() - start
    failed = 0
    for mode, outcomes in results.items():
        counts = Counter(o.status for o in outcomes)
        for o in outcomes:
            if o.status == "fail":
                print(f"FAIL [{mode}] {o.op}: {o.reason}")
        failed += counts["fail"]
        print(
            f"{mode}: {len(outcomes)} signatures, {counts['pass']} passed, {counts['fail']} "
            f"failed, {counts['skip']} skipped (the CPU rejects random inputs, or answers "
            "them two ways)"
        )
    print(f"{seconds:.1f} s")
    if args.results:
        _save_results(Path(args.results), results)
    return 1 if failed else 0


def _selected(signatures: list[Signature], ops: str) -> list[Signature]:
    wanted = {o if o.startswith("aten::") else f"aten::{o}" for o in ops.split(",") if o}
    if not wanted:
        return signatures
    return [s for s in signatures if s.op in wanted or s.op.split(".")[0] in wanted]


def _save_results(path: Path, results: dict[str, list[Outcome]]) -> None:
    data = {mode: [o.__dict__ for o in outcomes] for mode, outcomes in results.items()}
    path.write_text(json.dumps(data, indent=1) + "\n")


def cmd_stats(args: argparse.Namespace) -> int:
    signatures = load(Path(args.file))
    per_op = Counter(s.op for s in signatures)
    calls = Counter[str]()
    for s in signatures:
        calls[s.op] += s.count
    sources = sorted({src for s in signatures for src in s.sources})
    print(f"{len(signatures)} signatures of {len(per_op)} ops, {sum(calls.values())} calls")
    print(f"from {len(sources)} sources: {', '.join(sources)}")
    print(f"\n{'op':48} {'signatures':>10} {'calls':>10}")
    for op, n in calls.most_common(args.top):
        print(f"{op:48} {per_op[op]:>10} {n:>10}")
    if args.results and Path(args.results).exists():
        results = json.loads(Path(args.results).read_text())
        for mode, outcomes in results.items():
            bad = Counter(o["op"] for o in outcomes if o["status"] == "fail")
            print(f"\n{mode}: {len(bad)} ops with failing signatures")
            for op, n in bad.most_common():
                print(f"  {op}: {n} failing of {per_op[op]}")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    import subprocess

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        print("error: give the command to run after --", file=sys.stderr)
        return 2
    env = {**os.environ, "NEURON_RECORD_SHAPES": str(Path(args.file).resolve())}
    return subprocess.call(command, env=env)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trnsim registry", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    test = sub.add_parser("test", help="op tests from a registry: device against CPU")
    test.add_argument("file", help="a registry file (NEURON_RECORD_SHAPES, trnsim record)")
    test.add_argument("--mode", default="eager,adaptive", help="modes, comma-separated")
    test.add_argument("--ops", default="", help="only these ops (comma-separated)")
    test.add_argument(
        "--per-op",
        type=int,
        default=0,
        metavar="K",
        help="a sample: at most K signatures of each op, spread over its shapes (default: all)",
    )
    test.add_argument("--results", help="write each signature's outcome to this JSON file")
    stats = sub.add_parser("stats", help="signatures per op, the ops that dominate, failures")
    stats.add_argument("file", help="a registry file")
    stats.add_argument("--top", type=int, default=25, help="ops listed (default 25)")
    stats.add_argument("--results", help="outcomes written by `test --results`")
    record = sub.add_parser(
        "record",
        prog="trnsim record",  # also `trnsim registry record`
        help="run a command, recording its op signatures",
        description="Runs COMMAND with NEURON_RECORD_SHAPES set: every op signature it "
        "dispatches to the device is written to FILE (the shape registry).",
    )
    record.add_argument("-o", "--file", default="shapes.jsonl", help="default shapes.jsonl")
    record.add_argument("argv", nargs=argparse.REMAINDER, help="-- python train.py ...")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.action != "record" and not Path(args.file).is_file():
        print(
            f"error: no registry file {args.file} (record one with trnsim record)", file=sys.stderr
        )
        return 2
    try:
        return {"test": cmd_test, "stats": cmd_stats, "record": cmd_record}[args.action](args)
    except RegistryFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
