"""Element sizes and names of the graph's dtypes (protos/graph.proto DType)."""

from __future__ import annotations

from trnsim.protos import graph_pb2

DType = graph_pb2.DType

# name (as torch spells it after "torch."), bytes per element
_TABLE: dict[int, tuple[str, int]] = {
    graph_pb2.FLOAT32: ("float32", 4),
    graph_pb2.FLOAT16: ("float16", 2),
    graph_pb2.BFLOAT16: ("bfloat16", 2),
    graph_pb2.FLOAT64: ("float64", 8),
    graph_pb2.INT8: ("int8", 1),
    graph_pb2.INT16: ("int16", 2),
    graph_pb2.INT32: ("int32", 4),
    graph_pb2.INT64: ("int64", 8),
    graph_pb2.BOOL: ("bool", 1),
    graph_pb2.UINT8: ("uint8", 1),
    graph_pb2.COMPLEX64: ("complex64", 8),
    graph_pb2.COMPLEX128: ("complex128", 16),
    graph_pb2.FLOAT8_E4M3FN: ("float8_e4m3fn", 1),
    graph_pb2.FLOAT8_E5M2: ("float8_e5m2", 1),
    graph_pb2.COMPLEX32: ("complex32", 4),
    graph_pb2.UINT16: ("uint16", 2),
    graph_pb2.UINT32: ("uint32", 4),
    graph_pb2.UINT64: ("uint64", 8),
}
_BY_NAME = {name: value for value, (name, _) in _TABLE.items()}
_LOW_PRECISION = {
    graph_pb2.BFLOAT16,
    graph_pb2.FLOAT16,
    graph_pb2.FLOAT8_E4M3FN,
    graph_pb2.FLOAT8_E5M2,
}


def known(dtype: int) -> bool:
    return dtype in _TABLE


def itemsize(dtype: int) -> int:
    return _TABLE[dtype][1]


def name(dtype: int) -> str:
    return _TABLE[dtype][0]


def from_name(dtype_name: str) -> int:
    try:
        return _BY_NAME[dtype_name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype_name!r}; use one of {sorted(_BY_NAME)}") from None


def is_low_precision(dtype: int) -> bool:
    """True for the dtypes the Tensor engine runs at full rate (BF16/FP16/FP8)."""
    return dtype in _LOW_PRECISION


def is_floating(dtype: int) -> bool:
    return name(dtype).startswith(("float", "bfloat"))
