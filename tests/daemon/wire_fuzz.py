"""A fuzzer of the daemon's wire: random bytes and structurally invalid requests, next to
valid ones, on the Compile stream and the unary methods.

    python tests/daemon/wire_fuzz.py [--examples 500]   # against a daemon it starts itself

The property, per message: exactly one answer, with a status that says what was wrong
(INVALID_REQUEST / INVALID_ARGUMENT, never UNKNOWN or INTERNAL, never silence); the daemon
stays up; and a valid request's executable is byte for byte a local compile's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trnsim import compiler
from trnsim.protos import compile_service_pb2 as svc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.daemon.helpers import request, start_daemon

SERVICE = "/trnsim.service.CompileService/"
UNARY_OK = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
UNARY_OK |= {grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass
class Tally:
    """What the fuzzer sent and got back."""

    sent: int = 0
    answered: int = 0
    cancels: int = 0  # of those sent, valid cancels (random bytes can be one): owed no answer
    statuses: Counter[str] = field(default_factory=Counter)
    identical: int = 0


# -- structurally invalid requests: a valid one with one thing broken ---------------------------
def _dtype(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].dtype = 1000 + n  # type: ignore[assignment]


def _negative_size(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].shape[0] = -1 - n


def _too_many_elements(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].shape[0] = (1 << 62) + n


def _negative_offset(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].storage_offset = -1 - n


def _strides_mismatch(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].strides.append(n)


def _too_many_dims(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].shape.extend([1] * (65 + n % 1000))
    r.graph.inputs[0].strides.extend([1] * (65 + n % 1000))


def _op_name(r: svc.CompileRequest, n: int) -> None:
    r.graph.nodes[0].op = ["", "x" * (300 + n), "aten", "a::b::c", "1x::y", "aten::" + "y" * 300][
        n % 6
    ]


def _dangling_input(r: svc.CompileRequest, n: int) -> None:
    r.graph.nodes[0].args[0].tensor.input = 7 + n


def _mutated_arg(r: svc.CompileRequest, n: int) -> None:
    r.graph.nodes[0].mutated_args.append(100 + n)


def _dangling_output(r: svc.CompileRequest, n: int) -> None:
    r.graph.outputs[0].node_output.node = 50 + n


def _target(r: svc.CompileRequest, n: int) -> None:
    r.target = f"trn{n}x"


def _version(r: svc.CompileRequest, n: int) -> None:
    r.compiler_version = f"0.0.{n}"


def _undeclared_scalar(r: svc.CompileRequest, n: int) -> None:
    r.graph.nodes[0].args.add(name="s", scalar_input=n + 3)


def _alias_out_of_range(r: svc.CompileRequest, n: int) -> None:
    r.graph.nodes[0].aliases.add(output=9 + n, argument=0)


def _deep_list(r: svc.CompileRequest, n: int) -> None:
    """Nested lists: decodable below protobuf's recursion limit, undecodable above it (an
    answer then comes under id 0, the request's own id being unreadable)."""
    arg = r.graph.nodes[0].args.add(name="deep")
    for _ in range(5 + n % 200):
        arg = arg.list.items.add()


def _unknown_op(r: svc.CompileRequest, n: int) -> None:
    """Well-formed names of operators torch does not have (daemon/op_schemas.txt)."""
    r.graph.nodes[0].op = ["os::system", "aten::add.NoSuchOverload", f"aten::mm.x{n}"][n % 3]


def _arity(r: svc.CompileRequest, n: int) -> None:
    if n % 2:
        r.graph.nodes[0].args.add(name=f"extra{n}", none={})
    else:
        del r.graph.nodes[0].args[1]


def _scalar_count(r: svc.CompileRequest, n: int) -> None:
    r.graph.num_scalar_inputs = (1 << 32) - 1 - n


def _huge_offset(r: svc.CompileRequest, n: int) -> None:
    r.graph.inputs[0].storage_offset = (1 << 62) + n


MUTATIONS: list[Callable[[svc.CompileRequest, int], None]] = [
    _dtype,
    _negative_size,
    _too_many_elements,
    _negative_offset,
    _strides_mismatch,
    _too_many_dims,
    _op_name,
    _dangling_input,
    _mutated_arg,
    _dangling_output,
    _target,
    _version,
    _undeclared_scalar,
    _alias_out_of_range,
    _deep_list,
    _unknown_op,
    _arity,
    _scalar_count,
    _huge_offset,
]


def broken(i: int, which: int, n: int) -> svc.CompileRequest:
    r = request(i)
    MUTATIONS[which % len(MUTATIONS)](r, n)
    return r


# -- sending ----------------------------------------------------------------------------------
def run_stream(address: str, messages: list[bytes], tally: Tally) -> list[svc.CompileResult]:
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 512 << 20)]
    ) as ch:
        call = ch.stream_stream(
            SERVICE + "Compile", response_deserializer=svc.CompileResult.FromString
        )
        answers = list(call(iter(messages), timeout=120))
    tally.sent += len(messages)
    tally.answered += len(answers)
    for a in answers:
        outcome = a.WhichOneof("outcome")
        tally.statuses[
            svc.ErrorClass.Name(a.error.error_class) if outcome == "error" else "OK"
        ] += 1
    return answers


def run_unary(address: str, method: str, data: bytes, tally: Tally) -> None:
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(SERVICE + method)
        tally.sent += 1
        try:
            call(data, timeout=60)
            tally.statuses["OK"] += 1
        except grpc.RpcError as e:
            assert e.code() in UNARY_OK, (method, e.code(), e.details())
            tally.statuses[e.code().name] += 1
        tally.answered += 1


def check_batch(address: str, batch: list[tuple[str, object]], tally: Tally) -> None:
    """Each item: ("bytes", raw), ("broken", request) or ("valid", request); one stream."""
    messages: list[bytes] = []
    expect: dict[int, tuple[str, svc.CompileRequest]] = {}
    cancels = 0  # random bytes that happen to be a valid cancel: answered by nothing
    for k, (kind, item) in enumerate(batch, start=1):
        if kind == "bytes":
            assert isinstance(item, bytes)
            cancel = as_cancel(item)
            if cancel is not None:
                cancels += 1
                if 1000 < cancel.id <= 1000 + len(batch):  # (never one of this batch's)
                    cancel.id = 0
                    item = cancel.SerializeToString()
            messages.append(item)
            continue
        assert isinstance(item, svc.CompileRequest)
        item.id = 1000 + k
        expect[item.id] = (kind, item)
        messages.append(item.SerializeToString())
    tally.cancels += cancels
    answers = run_stream(address, messages, tally)
    assert len(answers) == len(messages) - cancels, "one answer per message, none per cancel"
    by_id = {a.id: a for a in answers if a.id in expect}
    unreadable = {rid for rid in expect if rid not in by_id}  # (too deep for protobuf)
    others = sum(1 for a in answers if a.id not in expect)  # random bytes, unreadable ones
    assert others == messages_of_bytes(batch) - cancels + len(unreadable), "one answer each"
    for rid, (kind, sent) in expect.items():
        if rid in unreadable:
            continue
        answer = by_id[rid]
        if kind == "broken":
            assert answer.WhichOneof("outcome") == "error"
            refused = (svc.INVALID_REQUEST, svc.VERSION_MISMATCH, svc.UNKNOWN_OP)
            assert answer.error.error_class in refused
            assert answer.error.message
        else:
            assert answer.WhichOneof("outcome") == "executable", answer.error.message
            local = compiler.compile(sent.graph, sent.target, sent.options)
            assert answer.executable.data == local.SerializeToString(), "a local compile's bytes"
            tally.identical += 1


def as_cancel(raw: bytes) -> svc.CompileRequest | None:
    """The request random bytes decode to, when it is a cancel (which gets no answer)."""
    try:
        request = svc.CompileRequest.FromString(raw)
    except (DecodeError, RecursionError, ValueError):
        return None
    return request if request.cancel else None


def messages_of_bytes(batch: list[tuple[str, object]]) -> int:
    return sum(1 for kind, _ in batch if kind == "bytes")


# -- hypothesis ----------------------------------------------------------------------------------
items = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=512)),
    st.builds(
        lambda i, w, n: ("broken", broken(i, w, n)),
        st.integers(0, 5),
        st.integers(0, len(MUTATIONS) - 1),
        st.integers(0, 50),
    ),
    st.builds(lambda i: ("valid", request(i)), st.integers(0, 5)),
)
batches = st.lists(items, min_size=1, max_size=8)
unary = st.tuples(st.sampled_from(["Lookup", "GetInfo", "Stats"]), st.binary(max_size=256))


def fuzz(address: str, examples: int, tally: Tally, derandomize: bool = False) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=derandomize,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batches, st.lists(unary, max_size=3))
    def case(batch: list[tuple[str, object]], calls: list[tuple[str, bytes]]) -> None:
        check_batch(address, batch, tally)
        for method, data in calls:
            run_unary(address, method, data, tally)

    case()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="trn-fz-", dir="/tmp"))
    root.chmod(0o700)
    d = start_daemon(root, "--workers", "2")
    try:
        rss_before = psutil.Process(d.pid()).memory_info().rss
        tally = Tally()
        fuzz(d.address, args.examples, tally)
        rss_after = psutil.Process(d.pid()).memory_info().rss
        alive = d.proc.poll() is None
    finally:
        d.stop()
    print(
        f"requests sent {tally.sent} ({tally.cancels} of them cancels, owed no answer), "
        f"answers received {tally.answered}"
    )
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.statuses.items())))
    print(f"valid requests byte-identical to a local compile: {tally.identical}")
    print(f"daemon alive: {alive}; RSS before {rss_before >> 20} MiB, after {rss_after >> 20} MiB")
    return 0 if alive and tally.sent - tally.cancels == tally.answered else 1


if __name__ == "__main__":
    sys.exit(main())
