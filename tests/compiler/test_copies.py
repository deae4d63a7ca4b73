"""Copies and overwrites: what they move, and write-backs stored straight into their
destination (a functionalized graph's epilogue)."""

from __future__ import annotations

from trnsim.compiler import run_passes
from trnsim.compiler.graph import Alias, Graph, GraphBuilder, TensorType, Value
from trnsim.protos import executable_pb2 as ex

from .helpers import f32
from .test_memory_plan import check_schedule

N = 1 << 16
F32, BF16 = N * 4, N * 2
WRITES = [Alias(0, 0, writes=True)]
UNFUSED = ex.CompileOptions(disable_fusion=True)


def bf16(*shape: int) -> TensorType:
    return TensorType.contiguous(shape, "bfloat16")


def copy_(b: GraphBuilder, dst: Value, src: Value, out: TensorType) -> Value:
    return b.op("aten::copy_.default", dst, src, out=out, aliases=WRITES)


def dma_bytes(exe: ex.Executable, klass: int) -> int:
    return sum(i.bytes for i in exe.instructions if i.klass == klass and i.engine == ex.DMA)


def test_a_copy_reads_its_source_and_writes_its_destination_only():
    b = GraphBuilder()
    dst, src = b.input([N], "bfloat16"), b.input([N])
    copy_(b, dst, src, bf16(N))
    exe = run_passes(b.build(), "trn1").executable
    assert exe.hbm_bytes == F32 + BF16, "the destination's old contents are never read"


def test_fill_stores_without_loading():
    b = GraphBuilder()
    dst = b.input([N])
    b.op("aten::fill_.Scalar", dst, 0.5, out=f32(N), aliases=WRITES)
    exe = run_passes(b.build(), "trn1").executable
    assert dma_bytes(exe, ex.DMA_LOAD) == 0
    assert exe.hbm_bytes == F32


def test_an_in_place_write_in_a_kernel_is_stored_once():
    b = GraphBuilder()
    p, grad = b.input([N]), b.input([N])
    s = b.op("aten::mul.Tensor", grad, grad, out=f32(N))
    b.op("aten::add_.Tensor", p, s, out=f32(N), aliases=WRITES)
    c = run_passes(b.build(), "trn1")
    assert c.groups == [[0, 1]]
    assert dma_bytes(c.executable, ex.DMA_STORE) == F32


def test_a_cast_of_a_computed_value_is_the_kernels_store():
    b = GraphBuilder()
    x, out = b.input([N]), b.input([N], "bfloat16")
    y = b.op("aten::exp.default", x, out=f32(N))
    copy_(b, out, y, bf16(N))
    c = run_passes(b.build(), "trn1")
    assert c.groups == [[0, 1]], "the copy joins its producer's kernel"
    exe = c.executable
    assert exe.hbm_bytes == F32 + BF16, "x in, the bf16 result out; the fp32 value stays in SBUF"
    assert not [i for i in exe.instructions if i.klass == ex.DMA_COPY and i.engine == ex.DMA]
    check_schedule(exe)


def _write_back(between: str) -> Graph:
    """p <- p - g, the copy_ separated from its producer by another node (in `between`:
    "other" reads another input, "reads_p" reads p's old value). Compiled UNFUSED, so that
    the copy is a kernel of its own (fused, it would be the producer's kernel's store)."""
    b = GraphBuilder()
    p, g, other = b.input([N]), b.input([N]), b.input([N])
    new = b.op("aten::sub.Tensor", p, g, out=f32(N))
    e = b.op("aten::exp.default", p if between == "reads_p" else other, out=f32(N))
    copy_(b, p, new, f32(N))
    return b.build(e)


def test_a_write_back_is_stored_into_its_destination():
    c = run_passes(_write_back("other"), "trn1", UNFUSED)
    assert c.plan is not None and c.plan.stored_in_place == {2}
    source = c.plan.buffers[c.plan.buffer_of[Value(0, 0)]]
    assert source.role == ex.ALIAS and source.alias_of == c.plan.buffer_of[Value(None, 0)]
    exe = c.executable
    # sub: p, g in, the result out into p; exp: other in, its result out.
    assert exe.hbm_bytes == 3 * F32 + 2 * F32
    assert dma_bytes(exe, ex.DMA_COPY) == 0
    check_schedule(exe)


def test_a_write_back_waits_while_the_old_value_is_read():
    c = run_passes(_write_back("reads_p"), "trn1", UNFUSED)
    assert c.plan is not None and c.plan.stored_in_place == set()
    assert dma_bytes(c.executable, ex.DMA_COPY) == 2 * F32


def _foreach_write_back(pairs: list[tuple[int, int]]) -> set[int]:
    """_foreach_add((a, d), (x, y)), then copy_(list member m, output j) for (m, j) in pairs;
    returns the copies stored in place (as node indices)."""
    b = GraphBuilder()
    a, d, x, y, other = (b.input([N]) for _ in range(5))
    out = b.op("aten::_foreach_add.List", (a, d), (x, y), out=[f32(N), f32(N)])
    e = b.op("aten::exp.default", other, out=f32(N))
    for member, j in pairs:
        copy_(b, (a, d)[member], Value(out.node, j), f32(N))
    c = run_passes(b.build(e), "trn1", UNFUSED)  # (keeps the copies out of the kernel)
    check_schedule(c.executable)
    assert c.plan is not None
    return c.plan.stored_in_place


def test_a_foreach_output_overwrites_only_its_own_list_member():
    assert _foreach_write_back([(0, 0), (1, 1)]) == {2, 3}
    assert _foreach_write_back([(1, 0)]) == set(), "output 0 into d, which the op still reads"
