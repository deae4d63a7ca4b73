"""Shape-only execution (NEURON_SIM_NUMERICS=off): every launch is priced, queued and
accounted as with numerics on, but no op computes a value.

A step's fresh outputs are new host tensors of the declared layout whose memory is never
written, so the pages behind them are never touched and the process's memory stays
proportional to metadata (the kernel maps untouched pages lazily). Values the host reads
are placeholders (zeros, False), which the client names with their source line.

Ops whose output shape depends on values take an assumption instead:
- nonzero, masked_select, boolean-mask indexing: as many elements as the mask's expected
  number of nonzeros. A mask made by scattering n values into a zeroed tensor of N
  elements (one_hot, a router's expert mask) holds n/N nonzeros, which gives uniform
  routing to MoE layers; any other mask is taken as all nonzero (the upper bound).
- unique and its kin: every element distinct (the upper bound).
- histc and bincount (an MoE layer's tokens per expert): the values spread evenly over
  the bins (uniform routing), as real counts; bincount has max(minlength, 1) bins.
- repeat_interleave with a repeats tensor: one each.
Each assumption is reported through `hooks.assumed` (torch.neuron.explain lists them).

Values the host supplied stay real: integer and boolean tensors copied to the device
(token ids, masks, labels, positions) and tensors made from nothing (arange, full), and a
small op (SMALL_BYTES of operands and results) whose operands are all real is computed, its
results real too. So the model's own control flow over its masks and positions (is every
token attended? where does the padding start?) takes the branch it takes with numerics
on, while everything that depends on weights or activations is a placeholder.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch


class _Numerics:
    """Whether steps compute values (NEURON_SIM_NUMERICS); one flag read per launch."""

    on = True


NUMERICS = _Numerics()


def set_numerics(on: bool) -> None:
    NUMERICS.on = on
    density.clear()
    real.clear()


class _Hooks:
    """What the client learns of: a placeholder value handed to the host (op name) and a
    data-dependent shape taken by assumption (op name, the assumption)."""

    placeholder: Callable[[str], None] = staticmethod(lambda op: None)
    assumed: Callable[[str, str], None] = staticmethod(lambda op, text: None)
    computed: Callable[[str, str], None] = staticmethod(lambda op, text: None)


hooks = _Hooks()


class _Issued:
    """Where the op being run was issued ("file:line"), when the runner knows it better than
    the stack does (a recorded graph runs at a later line): "" for the caller's line."""

    where = ""


issued = _Issued()


class Known:
    """A value known per span of host memory (a storage's bytes), found from any address in
    it: a view, or the DLPack alias of a view, whose storage starts where the view does."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.spans: dict[int, tuple[int, Any]] = {}  # start -> (end, value)

    def clear(self) -> None:
        self.starts.clear()
        self.spans.clear()

    def __bool__(self) -> bool:
        return bool(self.starts)

    def set(self, t: torch.Tensor, value: Any) -> None:
        start, end = _span(t)
        if end > start:
            self.drop(t)
            bisect.insort(self.starts, start)
            self.spans[start] = (end, value)

    def drop(self, t: torch.Tensor) -> None:
        """Forgets every span that overlaps t's storage (what lived there before)."""
        start, end = _span(t)
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.spans[self.starts[i - 1]][0] > start:
            i -= 1  # (one that starts before and reaches into it)
        while i < len(self.starts) and self.starts[i] < max(end, start + 1):
            del self.spans[self.starts.pop(i)]

    def get(self, t: torch.Tensor, default: Any = None) -> Any:
        ptr = t.data_ptr()
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            end, value = self.spans[self.starts[i]]
            if ptr < end:
                return value
        return default


def _span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


# Expected fraction of nonzero elements per storage, where an op made it known: 0 after
# zeroing, n/N after scattering n values. Absent: unknown (taken as 1).
density = Known()


def forget(t: torch.Tensor) -> None:
    """t's storage was (re)allocated or overwritten with unknown values: what was known of
    the memory it covers goes."""
    if density:
        density.drop(t)
    if real:
        real.drop(t)


# -- real values --------------------------------------------------------------------------------
SMALL_BYTES = 1 << 20  # an op over real values with operands and results this small computes
real = Known()  # the storages whose values are real (value True)

# In-place ops whose written argument's old values are never read.
_OVERWRITES = frozenset(
    [
        "fill_",
        "zero_",
        "copy_",
        "normal_",
        "uniform_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "arange",
    ]
)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def is_real(t: Any) -> bool:
    """Whether t holds real values (an empty tensor holds none to miss)."""
    return isinstance(t, torch.Tensor) and (t.numel() == 0 or bool(real.get(t, False)))


def mark_real(values: list[Any]) -> None:
    for t in values:
        if isinstance(t, torch.Tensor):
            real.set(t, True)


def host_supplied(t: torch.Tensor) -> bool:
    """Whether a copy from the host makes t's storage real: integer and boolean data (ids,
    masks, labels, positions) covering the whole storage. Floating data (weights, features)
    is left unknown: what it feeds is what shape-only mode does not compute."""
    whole = t.numel() * t.element_size() == t.untyped_storage().nbytes()
    return whole and not (t.is_floating_point() or t.is_complex())


def computes(
    name: str,
    args: list[Any],
    written: list[int],
    declared: Sequence[tuple[tuple[int, ...], tuple[int, ...]] | None],
    dtypes: Sequence[torch.dtype | None],
) -> bool:
    """Whether this op is computed in shape-only mode: every tensor it reads is real and
    its operands and results together are at most SMALL_BYTES."""
    base, _, overload = name.split("::", 1)[-1].partition(".")
    skip = set(written) if base in _OVERWRITES or overload.startswith("out") else set()
    nbytes = 0
    for i, a in enumerate(args):
        for t in _tensors(a):
            nbytes += t.numel() * t.element_size()
            if i not in skip and not is_real(t):
                return False
    for d, dtype in zip(declared, dtypes, strict=True):
        if d is not None and dtype is not None:
            n = dtype.itemsize
            for size in d[0]:
                n *= size
            nbytes += n
    return nbytes <= SMALL_BYTES


def settle(buffer: torch.Tensor, result: Any) -> torch.Tensor:
    """A graph output's buffer after a shape-only run: the computed result copied in (it is
    small), or the buffer left unknown."""
    if result is not buffer and is_real(result):
        buffer.copy_(result)
        real.set(buffer, True)
    elif not is_real(result):
        forget(buffer)
    return buffer


def _density(t: Any) -> float:
    if not isinstance(t, torch.Tensor):
        return 1.0
    return float(density.get(t, 1.0))


_ZEROS = frozenset(["aten::zeros.default", "aten::zeros_like.default", "aten::new_zeros.default"])
_SCATTERS = frozenset(
    [
        "aten::scatter.value",
        "aten::scatter.src",
        "aten::scatter_.value",
        "aten::scatter_.src",
    ]
)
# Ops whose output holds (a selection of) its first argument's elements: same density.
_SELECTS = frozenset(
    [
        "aten::index.Tensor",
        "aten::_unsafe_index.Tensor",
        "aten::index_select.default",
        "aten::clone.default",
        "aten::_to_copy.default",
        "aten::contiguous.default",
        "aten::squeeze.dim",
    ]
)


def _scattered(name: str, args: list[Any], base: torch.Tensor) -> float:
    index = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    if index is None or base.numel() == 0:
        return 1.0
    return min(1.0, _density(base) + index.numel() / base.numel())


def empty(shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype | None) -> torch.Tensor:
    """Host memory for a tensor, never written: with deterministic algorithms on PyTorch
    would fill it (touching every page), which shape-only mode must not."""
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    if not fill or not torch.are_deterministic_algorithms_enabled():
        return torch.empty_strided(shape, strides, dtype=dtype)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        return torch.empty_strided(shape, strides, dtype=dtype)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]


def note(name: str, args: list[Any], t: torch.Tensor, in_place: bool) -> None:
    """What is known of the values of t, which op `name` just wrote (in place or fresh),
    whether or not it computed them: its expected density of nonzeros."""
    zeroing = name in _ZEROS or name == "aten::zero_.default"
    if zeroing or (name == "aten::fill_.Scalar" and len(args) > 1 and args[1] == 0):
        density.set(t, 0.0)
    elif name in _SCATTERS and isinstance(args[0], torch.Tensor):
        density.set(t, _scattered(name, args, t if in_place else args[0]))
    elif not in_place and name in _SELECTS and args and isinstance(args[0], torch.Tensor):
        known = density.get(args[0])
        if known is None:
            density.drop(t)
        else:
            density.set(t, known)
    else:
        density.drop(t)


def fresh(
    name: str,
    args: list[Any],
    declared: tuple[tuple[int, ...], tuple[int, ...]],
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """A new output of the declared layout, its memory untouched."""
    t = empty(declared[0], declared[1], dtype)
    real.drop(t)
    note(name, args, t, in_place=False)
    return t


def written(
    name: str,
    args: list[Any],
    argument: int,
    declared: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> Any:
    """The argument an op writes through (in place, out=), unwritten. An out= argument
    the kernel would resize takes the declared size and layout, as the kernel leaves it."""
    t = args[argument]
    if not isinstance(t, torch.Tensor):
        return t
    if declared is not None and tuple(t.shape) != declared[0]:
        t.set_(empty(declared[0], declared[1], t.dtype))  # type: ignore[call-overload]
    real.drop(t)
    note(name, args, t, in_place=True)
    return t


def computed(name: str, args: list[Any], written: list[int], outputs: list[Any]) -> None:
    """After an op computed its results for real: they are real, with what is known of
    their density (a one_hot of real indices, zeros...)."""
    mark_real(outputs)
    in_place = {id(args[a]) for a in written if isinstance(args[a], torch.Tensor)}
    for t in outputs:
        if isinstance(t, torch.Tensor):
            note(name, args, t, in_place=id(t) in in_place)


# Ops whose CPU kernel makes outputs of other sizes than their Meta kernel declares (the
# sizes numerics-on runs produce, and so the ones shape-only runs must make): batch norm in
# inference gives empty saved statistics.
def _inference_norm(args: list[Any]) -> bool:
    return len(args) > 5 and args[5] is False


_CPU_SIZES: dict[str, Callable[[list[Any]], bool]] = {
    "aten::_native_batch_norm_legit_no_training.default": lambda args: True,
    "aten::native_batch_norm.default": _inference_norm,
    "aten::_native_batch_norm_legit.default": _inference_norm,
}


def as_cpu_makes(
    name: str, args: list[Any], declared: list[tuple[tuple[int, ...], tuple[int, ...]] | None]
) -> list[tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """The output sizes the CPU kernel gives, where they differ from the declared ones."""
    rule = _CPU_SIZES.get(name)
    if rule is None or not rule(args):
        return declared
    return [declared[0], ((0,), (1,)), ((0,), (1,))]


# Ops returning a Python value decided by metadata alone (shapes, dtypes, flags), never by
# the elements: run for real in shape-only mode (SDPA's backend choice: flash attention or
# the math decomposition, as the CPU would choose).
METADATA_ONLY = frozenset(["aten::_fused_sdp_choice.default", "aten::is_same_size.default"])

_PLACEHOLDERS = {"bool": False, "int": 0, "SymInt": 0, "float": 0.0, "Scalar": 0}


def with_values(op: Any, outs: list[Any]) -> list[Any]:
    """The op's flat results: its tensor outputs, and a placeholder for each value it
    returns to the host (bool False, numbers 0), in the schema's order."""
    returns = op._schema.returns
    if all("Tensor" in str(r.type) for r in returns):
        return outs
    flat: list[Any] = []
    tensors = iter(outs)
    for r in returns:
        kind = str(r.type)
        if kind.startswith("Tensor[]") or kind == "List[Tensor]":
            flat.extend(tensors)
        elif "Tensor" in kind:
            flat.append(next(tensors, None))
        else:
            hooks.placeholder(str(op))
            flat.append(_PLACEHOLDERS.get(kind, 0))
    return flat


# -- data-dependent shapes ----------------------------------------------------------------------
def _new(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An output of a data-dependent op: nothing is known of the memory it takes."""
    t = torch.empty(shape, dtype=dtype)
    forget(t)
    return t


def _count(mask: torch.Tensor, numel: int | None = None) -> int:
    """The mask's nonzeros: counted where its values are real (a mask the host supplied),
    else expected from its density."""
    n = mask.numel() if numel is None else numel
    if is_real(mask):
        nonzero = int(mask.count_nonzero())
        return nonzero if numel is None else nonzero * (n // max(mask.numel(), 1))
    return round(n * _density(mask))


def _assume(op: str, mask: torch.Tensor, rows: int) -> None:
    if not is_real(mask):  # (a real mask's count is exact: nothing assumed)
        hooks.assumed(op, _mask_text(mask, rows))


def _nonzero(op: str, args: list[Any]) -> list[Any]:
    x = args[0]
    rows = _count(x)
    _assume(op, x, rows)
    return [_new((rows, x.dim()), dtype=torch.int64)]


def _mask_text(mask: torch.Tensor, rows: int) -> str:
    known = density.get(mask)
    if known is None:
        return f"every element of a {tuple(mask.shape)} mask taken as nonzero: {rows}"
    return f"{known:.4g} of a {tuple(mask.shape)} mask nonzero (scattered): {rows}"


def _masked_select(op: str, args: list[Any]) -> list[Any]:
    x, mask = args[0], args[1]
    numel = torch.broadcast_shapes(x.shape, mask.shape).numel()  # type: ignore[no-untyped-call]
    rows = _count(mask, numel)
    _assume(op, mask, rows)
    return [_new((rows,), dtype=x.dtype)]


def _index(op: str, args: list[Any]) -> list[Any]:
    """Indexing with boolean masks: each mask stands for that many int64 indices."""
    x, indices = args[0], list(args[1])
    meta_indices: list[Any] = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            rows = _count(i)
            _assume(op, i, rows)
            meta_indices.extend(
                torch.empty((rows,), dtype=torch.int64, device="meta") for _ in range(i.dim())
            )
        elif isinstance(i, torch.Tensor):
            meta_indices.append(torch.empty_like(i, device="meta"))
        else:
            meta_indices.append(i)
    meta = torch.ops.aten.index.Tensor(torch.empty_like(x, device="meta"), meta_indices)
    return [_new(meta.shape, dtype=meta.dtype)]


def _unique(op: str, args: list[Any]) -> list[Any]:
    x = args[0]
    n = x.numel()
    hooks.assumed(op, f"every element of a {tuple(x.shape)} tensor distinct: {n}")
    values = _new((n,), dtype=x.dtype)
    inverse = _new(x.shape, dtype=torch.int64)
    counts = _new((n,), dtype=torch.int64)
    if op.startswith("aten::_unique."):
        return [values, inverse]
    return [values, inverse, counts]


def _uniform_counts(n: int, bins: int, dtype: torch.dtype) -> torch.Tensor:
    """n items spread evenly over the bins (the first n % bins get one more): real values,
    so the sizes the host derives from them (MoE group offsets) are those of uniform
    routing."""
    counts = _new((bins,), dtype=dtype).fill_(n // bins)
    counts[: n % bins] += 1
    real.set(counts, True)
    return counts


def _histc(op: str, args: list[Any]) -> list[Any]:
    x, bins = args[0], int(args[1]) if len(args) > 1 else 100
    hooks.assumed(op, f"{x.numel()} values spread evenly over {bins} bins (uniform routing)")
    return [_uniform_counts(x.numel(), bins, x.dtype)]


def _bincount(op: str, args: list[Any]) -> list[Any]:
    x = args[0]
    minlength = int(args[2]) if len(args) > 2 and args[2] is not None else 0
    weights = args[1] if len(args) > 1 else None
    bins = max(minlength, 1)
    hooks.assumed(
        op, f"{bins} bins (the largest value is not known), {x.numel()} values spread evenly"
    )
    dtype = torch.float64 if isinstance(weights, torch.Tensor) else torch.int64
    if isinstance(weights, torch.Tensor) and weights.dtype == torch.float32:
        dtype = torch.float32
    return [_uniform_counts(x.numel(), bins, dtype)]


def _repeat_interleave(op: str, args: list[Any]) -> list[Any]:
    repeats = args[0]
    hooks.assumed(op, f"each of {repeats.numel()} repeats taken as 1")
    return [_new((repeats.numel(),), dtype=repeats.dtype)]


_ASSUMED: dict[str, Callable[[str, list[Any]], list[Any]]] = {
    "aten::nonzero.default": _nonzero,
    "aten::masked_select.default": _masked_select,
    "aten::index.Tensor": _index,
    "aten::_unique.default": _unique,
    "aten::_unique2.default": _unique,
    "aten::unique_dim.default": _unique,
    "aten::unique_consecutive.default": _unique,
    "aten::bincount.default": _bincount,
    "aten::histc.default": _histc,
    "aten::repeat_interleave.Tensor": _repeat_interleave,
}


def assumed_outputs(
    name: str, op: Any, args: list[Any], dtypes: Sequence[torch.dtype | None]
) -> list[Any] | None:
    """A data-dependent op's outputs by assumption; None for an op of static shapes. (The
    index op is data-dependent only with boolean masks.)"""
    handler = _ASSUMED.get(name)
    if handler is None:
        return None
    if name == "aten::index.Tensor" and not any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]
    ):
        return None
    return handler(name, args)


_no_meta: dict[str, bool] = {}


def computed_for_lack_of_meta(name: str) -> bool:
    """An op without a Meta kernel (CTC loss's backward): its sizes are unknown until it
    runs, so shape-only mode computes it (told through hooks.assumed)."""
    known = _no_meta.get(name)
    if known is None:
        op = name.removesuffix(".default")
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        known = _no_meta[name] = (
            name not in _ASSUMED
            and name.startswith("aten::")
            and not any(
                has(op, key)
                for key in ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
            )
        )
    return known


def unsupported(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name} has an output shape that depends on the values, and shape-only mode "
        "(NEURON_SIM_NUMERICS=off) has no assumption for it. Run with numerics on, or give "
        "the op a static size (nonzero_static, an output_size argument)."
    )
