"""Random programs for the differential fuzzer: a program is a list of instructions, each an
opcode and three numbers. The interpreter turns every instruction into a valid op on the
tensors alive at that point (the numbers pick operands, dims, sizes), so the same program
does the same thing on any device and in any mode, and shrinks to a small readable one.

What the programs draw on: elementwise ops, reductions, matmul; views (view, transpose,
expand, slicing, select, as_strided, unsqueeze, diagonal, dtype views); in-place ops on views
and on bases; out=; copy_, set_, resize_ and `.data` swaps; tensors freed and made anew
(Python ids and device addresses are reused); random numbers; autograd and optimizer
steps; sync points (.item(), .cpu(), data-dependent branches and shapes), host copies,
CPU scalars and a second stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

Instruction = tuple[str, int, int, int]
MAX_SLOTS = 8


@dataclass
class Machine:
    """The state a program runs on: a pool of tensors (slots), parameters with an optimizer,
    and the log of everything the host read from the device while it ran."""

    device: str
    slots: list[torch.Tensor] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    log: list[Any] = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None
    stream: Any = None
    stats: tuple[torch.Tensor, torch.Tensor] | None = None  # batch norm's running statistics

    @classmethod
    def start(cls, device: str) -> Machine:
        """The same initial tensors on any device (from a fixed CPU generator)."""
        g = torch.Generator().manual_seed(1234)
        m = cls(device)
        for shape in ((4, 4), (4, 4), (4,), (3, 4), (4, 1)):
            m.slots.append(torch.randn(shape, generator=g).to(device))
        m.slots.append(torch.randint(0, 4, (4,), generator=g).to(device))
        for shape in ((4, 4), (4,)):
            m.params.append(torch.randn(shape, generator=g).to(device).requires_grad_())
        lr = 0.1
        m.optimizer = torch.optim.SGD(m.params, lr=lr, momentum=0.9)
        return m

    # -- operands ---------------------------------------------------------------------------
    def pool(self) -> list[torch.Tensor]:
        return self.slots + self.params

    def pick(self, n: int, where: Callable[[torch.Tensor], bool] = lambda t: True) -> Any:
        candidates = [t for t in self.pool() if where(t)]
        return candidates[n % len(candidates)] if candidates else None

    def floats(self, n: int) -> torch.Tensor | None:
        return self.pick(n, lambda t: t.is_floating_point() and t.numel() > 0)

    def writable(self, n: int) -> torch.Tensor | None:
        """A float tensor an in-place op may write (no leaf that requires grad)."""
        return self.pick(n, lambda t: t.is_floating_point() and t.numel() > 0 and not _grad_leaf(t))

    def put(self, t: Any, n: int) -> None:
        """A new slot; when the pool is full, it replaces (frees) slot n."""
        if not isinstance(t, torch.Tensor):
            return
        if len(self.slots) < MAX_SLOTS:
            self.slots.append(t)
        else:
            self.slots[n % len(self.slots)] = t

    # -- running ----------------------------------------------------------------------------
    def run(self, program: list[Instruction]) -> None:
        for op, a, b, c in program:
            try:
                OPS[op](self, a, b, c)
            except (RuntimeError, ValueError, IndexError, TypeError) as e:
                # Autograd refusals (in-place on saved tensors...) are raised the same way
                # in every mode: the error is part of what the program observed.
                self.log.append(("error", type(e).__name__, _first_line(e)))

    def observe(self) -> list[Any]:
        """Everything the program can see at its end, on the CPU."""
        out: list[Any] = [self.log]
        for t in self.pool():
            out.append((tuple(t.shape), tuple(t.stride()), t.storage_offset(), _cpu(t)))
        out.extend(_cpu(p.grad) if p.grad is not None else None for p in self.params)
        out.extend(_cpu(s) for s in self.stats or ())
        return out


def _grad_leaf(t: torch.Tensor) -> bool:
    return t.is_leaf and t.requires_grad


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu() if t.device.type != "cpu" else t.detach().clone()


def _first_line(e: BaseException) -> str:
    """The message without what differs between devices or runs (device names, lines)."""
    line = str(e).split("\n", 1)[0]
    return line.replace("neuron:0", "<dev>").replace("cpu", "<dev>")[:80]


def _same_shape(t: torch.Tensor) -> Callable[[torch.Tensor], bool]:
    return lambda u: u.shape == t.shape and u.is_floating_point()


def _no_overlap(t: torch.Tensor) -> bool:
    """No two elements share memory (an expanded view cannot be written)."""
    return bool(torch._debug_has_internal_overlap(t) == 0)


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _apart(
    t: torch.Tensor, where: Callable[[torch.Tensor], bool]
) -> Callable[[torch.Tensor], bool]:
    """Operands an in-place op on t may read: t itself or memory t does not share (a partial
    overlap is an error, raised eagerly in eager mode and at the next sync in adaptive)."""
    ptr = t.untyped_storage().data_ptr()
    return lambda u: where(u) and (u is t or u.untyped_storage().data_ptr() != ptr)


def _broadcasts_into(t: torch.Tensor) -> Callable[[torch.Tensor], bool]:
    def ok(u: torch.Tensor) -> bool:
        if not u.is_floating_point() or u.dim() > t.dim():
            return False
        try:
            return torch.broadcast_shapes(t.shape, u.shape) == t.shape
        except RuntimeError:
            return False

    return ok


# -- the instructions -------------------------------------------------------------------------
UNARY = [torch.neg, torch.exp, torch.sin, torch.relu, torch.sigmoid, torch.tanh, torch.abs]
UNARY_SCALAR = [
    lambda t: t * 2.5,
    lambda t: t + 1,
    lambda t: torch.tensor(3.0) * t,  # a CPU scalar tensor mixes with device tensors
    lambda t: t.clamp(-0.5, 0.5),
    lambda t: t.pow(2),
]
BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.atan2]


def unary(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    fns = UNARY + UNARY_SCALAR
    m.put(fns[b % len(fns)](t), c)


def twins(m: Machine, a: int, b: int, c: int) -> None:
    """The same op on the same tensor before and after a write to it (or to a view of it):
    two values a compiler must not merge."""
    t = m.writable(a)
    if t is None:
        return
    fns = UNARY + UNARY_SCALAR
    fn = fns[b % len(fns)]
    before = fn(t)
    target = t[0] if c % 2 and t.dim() > 0 else t
    target.add_(1.0)
    m.put(before, a)
    m.put(fn(t), a + 1)


def binary(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    u = m.pick(b, _broadcasts_into(t))
    m.put(BINARY[c % len(BINARY)](t, u), a + b)


def reduce(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    kind = c % 4
    if kind == 0:
        m.put(t.sum(), b)
    elif kind == 1:
        m.put(t.sum(dim=b % max(t.dim(), 1), keepdim=bool(c & 4)), b)
    elif kind == 2:
        m.put(t.amax(dim=b % max(t.dim(), 1)), b)
    else:
        m.put(t.mean(dim=b % max(t.dim(), 1)), b)


def matmul(m: Machine, a: int, b: int, c: int) -> None:
    t = m.pick(a, lambda u: u.is_floating_point() and u.dim() == 2)
    if t is None:
        return
    u = m.pick(b, lambda u: u.dtype == t.dtype and u.dim() == 2 and u.shape[0] == t.shape[1])
    m.put(t @ (u if u is not None else t.t()), c)


def view(m: Machine, a: int, b: int, c: int) -> None:
    t = m.pick(a, lambda u: u.numel() > 0)
    kind = b % 10
    if kind == 0 and t.is_contiguous():
        v = t.view(-1)
    elif kind == 1 and t.dim() >= 2:
        v = t.transpose(0, 1)
    elif kind == 2:
        v = t.unsqueeze(c % (t.dim() + 1))
    elif kind == 3 and t.dim() >= 1 and t.shape[0] > 1:
        start = c % t.shape[0]
        v = t[start : start + 2]
    elif kind == 4 and t.dim() >= 1:
        v = t.select(c % t.dim(), c % t.shape[c % t.dim()]) if t.dim() > 1 else t[c % t.shape[0]]
    elif kind == 5:
        v = _expand(t, c)
    elif kind == 6:
        v = _as_strided(t, c)
    elif kind == 7 and t.dim() == 2:
        v = t.diagonal()
    elif kind == 8 and t.dtype == torch.float32:
        v = t.view(torch.int32)  # the same bits, another dtype
    elif kind == 9 and t.dim() >= 2:
        v = t.transpose(0, 1).reshape(-1)  # a copy, then an alias made beneath the dispatcher
    else:
        v = t.detach()
    m.put(v, a + c)


def _expand(t: torch.Tensor, c: int) -> torch.Tensor:
    if t.dim() == 0:
        return t.expand(1 + c % 3)
    if t.dim() == 1:
        return t.expand(2 + c % 3, t.shape[0])
    sizes = [s if s != 1 else 1 + c % 4 for s in t.shape]
    return t.expand(*sizes)


def _as_strided(t: torch.Tensor, c: int) -> torch.Tensor:
    """A 2x2 window on t's storage, inside its bounds."""
    numel = t.untyped_storage().nbytes() // t.element_size()
    s0, s1 = 1 + c % 3, 1 + (c // 3) % 2
    span = s0 + s1
    if numel <= span:
        return t.detach()
    offset = (c // 7) % (numel - span)
    return torch.as_strided(t, (2, 2), (s0, s1), offset)


ACTIVATIONS: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.nn.functional.silu,
    torch.nn.functional.gelu,
    lambda h: h * h,
    torch.tanh,
    lambda h: torch.softmax(h, dim=-1),
]


def layer(m: Machine, a: int, b: int, c: int) -> None:
    """A small network layer over a parameter: a 3-D linear (its mm output is aliased beneath
    the dispatcher by _unsafe_view), an activation, maybe a reshape of a transpose and a
    sync. Only autograd keeps the intermediates: a later backward reads them."""
    p = m.params[0]
    t = m.pick(a, lambda u: u.dtype == p.dtype and u.dim() >= 1 and u.shape[-1] == p.shape[1])
    if t is None:
        return
    x = t.reshape(1, -1, p.shape[1])
    if c % 2:
        x = x.expand(2, -1, -1)
    h = torch.nn.functional.linear(x, p, m.params[1] if c & 2 else None)
    y = ACTIVATIONS[b % len(ACTIVATIONS)](h)
    if c & 4:
        y = y.transpose(1, 2).reshape(y.shape[0], -1)
    if c & 8:
        m.log.append(("layer", y.sum().item()))  # cuts the graph before any backward
    m.put(y, a + b)


def in_place(m: Machine, a: int, b: int, c: int) -> None:
    t = m.writable(a)
    if t is None:
        return
    kind = c % 8
    if kind == 0:
        t.mul_(1.5)
    elif kind == 1:
        u = m.pick(b, _apart(t, _broadcasts_into(t)))
        t.add_(u, alpha=0.5)
    elif kind == 2:
        t.clamp_(-1.0, 1.0)
    elif kind == 3:
        t.zero_()
    elif kind == 4:
        u = m.pick(b, _apart(t, _same_shape(t)))
        t.copy_(u)
    elif kind == 5 and t.dim() >= 1:
        t[b % t.shape[0]] = 7.0  # a write into a view of t
    elif kind == 6 and torch._debug_has_internal_overlap(t) == 0:
        # (on an expanded tensor masked_fill_ only warns, when its kernel runs: at the op in
        # eager mode, at the flush in adaptive mode; the other writes refuse alike)
        t.masked_fill_(t > 0, -2.0)
    else:
        t.sigmoid_()


def out_variant(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    u = m.pick(b, _broadcasts_into(t))
    out = m.writable(c) if c % 2 else None
    shared = out is not None and {_ptr(out)} & {_ptr(t), _ptr(u)}
    if out is None or shared or out.shape != t.shape or out._is_view() or out.dtype != t.dtype:
        out = torch.empty(0, device=t.device, dtype=t.dtype)  # resized by the op
    with torch.no_grad():  # (out= does not take part in autograd)
        torch.mul(t, u, out=out)
    m.put(out, c)


def storage_ops(m: Machine, a: int, b: int, c: int) -> None:
    """set_ (a tensor takes another's storage), resize_ and `.data` swaps."""
    kind = c % 3
    if kind == 0:
        t = m.writable(a)
        u = m.pick(b, lambda x: x.dtype == t.dtype and not x.requires_grad)
        if t is not None and u is not None and not t._is_view() and not t.requires_grad:
            t.set_(u)
    elif kind == 1:
        t = m.writable(a)
        if t is not None and not t._is_view() and not t.requires_grad:
            n = 1 + b % 20
            grows = n > t.numel()
            t.resize_(n)
            if grows:
                t.fill_(0.25)  # the new elements are uninitialised: never read them so
    else:
        p = m.params[a % len(m.params)]
        u = m.pick(b, lambda x: x.shape == p.shape and x.is_floating_point() and _no_overlap(x))
        before = p * 2  # recorded reads of p on both sides of the swap
        p.data = u.detach().clone() * 0.5 if c % 2 else u.detach()
        m.put(before, a)
        m.put(p * 2, b)


def free_and_make(m: Machine, a: int, b: int, c: int) -> None:
    """Frees slots (their ids and memory can be reused) and makes new tensors."""
    if len(m.slots) > 2:
        del m.slots[a % len(m.slots)]
    shape = [(4, 4), (4,), (3, 4), (2, 4)][b % 4]
    kind = c % 4
    if kind == 0:
        t = torch.zeros(shape, device=m.device)
    elif kind == 1:
        t = torch.empty(shape, device=m.device).fill_(float(b % 5))
    elif kind == 2:
        t = torch.full(shape, 0.5, device=m.device) + m.floats(c).sum()
    else:
        t = torch.arange(16, dtype=torch.float32, device=m.device)[: _numel(shape)].view(shape)
    m.put(t, a)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def random(m: Machine, a: int, b: int, c: int) -> None:
    kind = c % 4
    if kind == 0:
        m.put(torch.rand(4, 4, device=m.device), a)
    elif kind == 1:
        t = m.writable(a)
        if t is not None:
            t.uniform_(-1, 1)
    elif kind == 2:
        t = m.floats(a)
        m.put(torch.nn.functional.dropout(t, p=0.5), b)  # the CPU's generator
    else:
        torch.manual_seed(b)  # reseeds the device generator too
        m.put(torch.randn(4, device=m.device), a)


def autograd(m: Machine, a: int, b: int, c: int) -> None:
    """Loss from parameters through recent slots; backward, then maybe an optimizer step."""
    p = m.params[a % len(m.params)]
    t = m.pick(b, lambda x: x.requires_grad and not x.is_leaf and x.is_floating_point())
    loss = (p * p).sum() if t is None else (t * p.sum()).sum() + p.sum()
    kind = c % 3
    loss.backward(retain_graph=bool(c & 4))
    m.log.append(("loss", _cpu(loss)))
    if kind == 1:
        assert m.optimizer is not None
        m.optimizer.step()
    elif kind == 2:
        assert m.optimizer is not None
        m.optimizer.zero_grad(set_to_none=bool(c & 8))
    else:
        m.put(p * 2, b)  # more graph from the (maybe stepped) parameters


def sync(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    kind = c % 6
    if kind == 0:
        m.log.append(("item", t.sum().item()))
    elif kind == 1:
        m.log.append(("cpu", _cpu(t)))
    elif kind == 2:
        if m.device == "neuron":
            torch.neuron.synchronize()
    elif kind == 3:  # a data-dependent branch
        m.put(t * 2 if bool((t.sum() > 0).item()) else t - 1, b)
    elif kind == 4:  # a data-dependent shape
        m.put(t[t > 0], b)
    else:
        m.log.append(("repr", len(repr(t))))


def host_copies(m: Machine, a: int, b: int, c: int) -> None:
    t = m.writable(a)
    if t is None:
        return
    if c % 2:
        t.copy_(torch.full(t.shape, float(b % 7)))  # host -> device into live memory
    else:
        m.put(t.cpu().add(1).to(m.device), b)


def streams(m: Machine, a: int, b: int, c: int) -> None:
    """Work on a second stream, joined back to the current one."""
    t = m.floats(a)
    if m.device != "neuron":
        m.put(t * 3 + 1, b)
        return
    if m.stream is None:
        m.stream = torch.neuron.Stream()
    m.stream.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(m.stream):
        y = t * 3 + 1
    torch.neuron.current_stream().wait_stream(m.stream)
    m.put(y, b)


def misc(m: Machine, a: int, b: int, c: int) -> None:
    t = m.floats(a)
    kind = c % 5
    if kind == 0:
        m.put(t.clone(), b)
    elif kind == 1:
        m.put(t.contiguous(), b)
    elif kind == 2:
        m.put(t.to(torch.float64 if b % 2 else torch.bfloat16), b)
    elif kind == 3:
        idx = m.pick(b, lambda x: x.dtype == torch.int64 and x.dim() == 1)
        if idx is not None and t.dim() >= 1:
            m.put(t[idx.clamp(0, t.shape[0] - 1)], b)
    else:
        m.put(torch.where(t > 0, t, t * 0.1), b)


def nn_ops(m: Machine, a: int, b: int, c: int) -> None:
    """Layers whose kernels have extra outputs and state: batch norm (running statistics
    written in place; in eval the CPU's saved statistics are empty), layer norm, embedding
    and embedding_bag, cross entropy, mean squared error."""
    t = m.pick(a, lambda u: u.dtype == torch.float32 and u.dim() == 2 and u.shape[1] == 4)
    if t is None:
        return
    kind = c % 6
    if kind == 0:
        if m.stats is None:
            m.stats = (torch.zeros(4, device=m.device), torch.ones(4, device=m.device))
        mean, var = m.stats
        training = bool(b % 2) and t.shape[0] > 1
        y = torch.nn.functional.batch_norm(t, mean, var, training=training, momentum=0.3)
    elif kind == 1:
        y = torch.nn.functional.layer_norm(t, (4,), m.params[1], None)
    elif kind == 2:
        idx = torch.tensor([b % 4, c % 4, (b + c) % 4], device=m.device)
        y = torch.nn.functional.embedding(idx, t) if t.shape[0] == 4 else t * 1
    elif kind == 3:
        idx = torch.tensor([b % 4, c % 4, 1, 3], device=m.device)
        offsets = torch.tensor([0, 1 + b % 3], device=m.device)
        weight = t if t.shape[0] == 4 else m.params[0]
        y = torch.nn.functional.embedding_bag(idx, weight, offsets, mode=("sum", "max")[b % 2])
    elif kind == 4:
        target = torch.tensor([b % 4] * t.shape[0], device=m.device)
        y = torch.nn.functional.cross_entropy(t, target)
    else:
        y = torch.nn.functional.mse_loss(t, t.detach().sin(), reduction=("mean", "none")[b % 2])
    m.put(y, a + b)


OPS: dict[str, Callable[[Machine, int, int, int], None]] = {
    "unary": unary,
    "binary": binary,
    "twins": twins,
    "reduce": reduce,
    "matmul": matmul,
    "layer": layer,
    "view": view,
    "in_place": in_place,
    "out": out_variant,
    "storage": storage_ops,
    "free": free_and_make,
    "random": random,
    "autograd": autograd,
    "sync": sync,
    "host": host_copies,
    "stream": streams,
    "misc": misc,
    "nn": nn_ops,
}

# Views and in-place ops drawn more often: they are where aliasing bugs live.
_WEIGHTED = [*OPS, "view", "view", "in_place", "in_place", "layer", "autograd", "sync"]
# Small numbers half the time: the same operands and the same ops come back often, which is
# where twins (CSE), reuse and aliasing meet.
_number = st.one_of(st.integers(0, 3), st.integers(0, 63))
instructions = st.tuples(st.sampled_from(_WEIGHTED), _number, _number, _number)
programs = st.lists(instructions, min_size=1, max_size=40)


def run_program(program: list[Instruction], device: str) -> list[Any]:
    """One repetition: a fresh machine, the program, what it observed."""
    m = Machine.start(device)
    m.run(program)
    return m.observe()
