"""The fusion pass: which nodes share a kernel, and why the cost model prefers it."""

from __future__ import annotations

from trnsim.compiler import compile, run_passes
from trnsim.compiler.graph import Alias, GraphBuilder, TensorType, Value
from trnsim.protos import executable_pb2 as ex

from .helpers import chain, f32, mlp
from .test_memory_plan import check_schedule

UNFUSED = ex.CompileOptions(disable_fusion=True)


def test_elementwise_chain_is_one_kernel_with_intermediates_in_sbuf():
    g = chain(8, size=1 << 16)
    c = run_passes(g, "trn2")
    assert c.groups == [list(range(8))]
    exe = c.executable
    assert exe.memory_plan.sbuf_internal_bytes > 0 and exe.memory_plan.hbm_scratch_bytes == 0
    stores = [i for i in exe.instructions if i.klass == ex.DMA_STORE]
    assert len(stores) == 1, "only the chain's result goes back to HBM"
    check_schedule(exe)


def test_fused_is_faster_with_fewer_hbm_bytes():
    g = chain(8, size=1 << 18)
    fused, unfused = compile(g, "trn2"), compile(g, "trn2", UNFUSED)
    assert fused.hbm_bytes < unfused.hbm_bytes / 4
    assert fused.modelled_ns < unfused.modelled_ns
    assert fused.cache_key != unfused.cache_key, "fusion is part of the key"


def test_matmul_epilogue_and_norm_fuse():
    b = GraphBuilder()
    x, w, bias = b.input([128, 256]), b.input([256, 512]), b.input([512])
    y = b.op("aten::mm.default", x, w, out=f32(128, 512))
    y = b.op("aten::add.Tensor", y, bias, out=f32(128, 512))
    y = b.op("aten::gelu.default", y, out=f32(128, 512))
    ln = b.op(
        "aten::native_layer_norm.default",
        y,
        (512,),
        None,
        None,
        1e-5,
        out=[f32(128, 512), f32(128, 1), f32(128, 1)],
    )
    c = run_passes(b.build(ln), "trn2")
    assert c.groups == [[0, 1, 2, 3]]
    check_schedule(c.executable)


def test_matmul_starts_a_new_kernel():
    c = run_passes(mlp(), "trn2")
    heads = [group[0] for group in c.groups]
    mm_nodes = [i for i, n in enumerate(c.graph.nodes) if n.op == "aten::mm.default"]
    for i in mm_nodes:
        assert (
            i in heads
            or c.graph.nodes[heads[[i in g for g in c.groups].index(True)]].op == "aten::t.default"
        )


def test_intermediates_too_big_for_sbuf_are_tiled():
    g = chain(6, size=1 << 22)  # 16 MiB per intermediate
    c = run_passes(g, "trn2", ex.CompileOptions(sbuf_budget_bytes=8 << 20))
    assert c.plan is not None and c.plan.sbuf_tiles > 1
    assert c.plan.sbuf_peak_bytes <= 8 << 20
    check_schedule(c.executable)


def test_values_read_by_later_kernels_leave_through_hbm():
    b = GraphBuilder()
    x = b.input([1024])
    e = b.op("aten::exp.default", x, out=f32(1024))
    r = b.op("aten::relu.default", e, out=f32(1024))
    w = b.input([1024, 1024])
    m = b.op("aten::mv.default", w, e, out=f32(1024))  # a matmul reads e: e leaves its kernel
    c = run_passes(b.build(r, m), "trn2")
    assert len(c.groups) == 2
    assert c.plan is not None
    e_buffer = c.plan.buffers[c.plan.buffer_of[Value(0, 0)]]
    assert e_buffer.memory == ex.HBM
    relu = c.plan.buffers[c.plan.buffer_of[Value(1, 0)]]
    assert relu.role == ex.OUTPUT
    check_schedule(c.executable)


def test_in_place_writes_inside_a_kernel_reach_hbm():
    b = GraphBuilder()
    p, grad = b.input([4096]), b.input([4096])
    s = b.op("aten::mul.Tensor", grad, grad, out=f32(4096))
    b.op("aten::add_.Tensor", p, s, out=f32(4096), aliases=[Alias(0, 0, writes=True)])
    exe = compile(b.build(), "trn2")
    stores = [i for i in exe.instructions if i.klass == ex.DMA_STORE]
    assert stores and sum(i.bytes for i in stores) >= 4096 * 4
    assert TensorType.contiguous([4096]).nbytes == 4096 * 4


def _dma_bytes(exe: ex.Executable, klass: int) -> int:
    return sum(i.bytes for i in exe.instructions if i.klass == klass and i.engine == ex.DMA)


def test_a_node_joins_the_kernel_it_reads_from_across_another_kernel():
    b = GraphBuilder()
    x, w, v = b.input([1024]), b.input([1024, 1024]), b.input([1024])
    e = b.op("aten::exp.default", x, out=f32(1024))
    m = b.op("aten::mv.default", w, v, out=f32(1024))  # a kernel of its own in between
    r = b.op("aten::relu.default", e, out=f32(1024))
    c = run_passes(b.build(m, r), "trn2")
    assert c.groups == [[0, 2], [1]]
    assert c.plan is not None
    assert c.plan.buffers[c.plan.buffer_of[Value(0, 0)]].memory == ex.SBUF
    check_schedule(c.executable)


def test_passes_over_different_tensors_merge_where_one_node_reads_them_all():
    """AdamW's shape: p * decay, g - m and v * beta2 are separate passes that one update
    combines; they become one kernel reading p, g, m, v once (multi-output fusion)."""
    n = 1 << 16
    b = GraphBuilder()
    p, g, m, v = (b.input([n]) for _ in range(4))
    decayed = b.op("aten::mul.Tensor", p, 0.99, out=f32(n))
    diff = b.op("aten::sub.Tensor", g, m, out=f32(n))
    scaled = b.op("aten::mul.Tensor", v, 0.999, out=f32(n))
    second = b.op("aten::addcmul.default", scaled, g, g, out=f32(n))
    step = b.op("aten::div.Tensor", diff, second, out=f32(n))
    new = b.op("aten::add.Tensor", decayed, step, out=f32(n))
    c = run_passes(b.build(new, second), "trn2")
    assert c.groups == [[0, 1, 2, 3, 4, 5]]
    assert _dma_bytes(c.executable, ex.DMA_LOAD) == 4 * n * 4, "p, g, m, v, each once"
    check_schedule(c.executable)


def test_a_pass_over_tensors_a_kernel_loads_joins_it():
    b = GraphBuilder()
    x, w, v = b.input([1024]), b.input([1024, 1024]), b.input([1024])
    e = b.op("aten::exp.default", x, out=f32(1024))
    m = b.op("aten::mv.default", w, v, out=f32(1024))
    s = b.op("aten::sin.default", x, out=f32(1024))  # reads only x, which the first loads
    c = run_passes(b.build(e, m, s), "trn2")
    assert c.groups == [[0, 2], [1]]
    check_schedule(c.executable)


def test_no_node_moves_across_a_write_of_what_it_reads():
    b = GraphBuilder()
    p, q = b.input([1024]), b.input([1024])
    e = b.op("aten::exp.default", p, out=f32(1024))
    b.op("aten::copy_.default", p, q, out=f32(1024), aliases=[Alias(0, 0, writes=True)])
    r = b.op("aten::add.Tensor", e, p, out=f32(1024))  # reads p as the copy left it
    c = run_passes(b.build(r), "trn2")
    assert c.groups == [[0], [1], [2]]
    check_schedule(c.executable)


def test_a_view_in_a_kernel_loads_nothing_of_its_own():
    n = 1 << 12
    b = GraphBuilder()
    x, w = b.input([n]), b.input([n])
    e = b.op("aten::exp.default", x, out=f32(n))
    r = b.op("aten::relu.default", e, out=f32(n))
    t = b.op("aten::view.default", w, (n,), out=f32(n), aliases=[Alias(0, 0)])
    s = b.op("aten::exp.default", r, out=f32(n))
    c = run_passes(b.build(s, t), "trn2")
    assert len(c.groups) == 1
    assert _dma_bytes(c.executable, ex.DMA_LOAD) == n * 4, "x only: nothing reads w's view"


def test_a_broadcast_constant_is_made_by_its_consumer():
    """A fill_ of a scalar that only elementwise ops read (foreach lerp's weights) is folded
    into them: no store of the constant, no load of it."""
    n = 1 << 16
    b = GraphBuilder()
    x, weight = b.input([n]), b.input([n])
    filled = b.op("aten::fill_.Scalar", weight, 0.1, out=f32(n), aliases=[Alias(0, 0, writes=True)])
    y = b.op("aten::mul.Tensor", x, filled, out=f32(n))
    c = run_passes(b.build(y), "trn2")
    assert c.plan is not None and c.plan.folded == {0}
    assert c.executable.hbm_bytes == 2 * n * 4, "x in, y out"
    check_schedule(c.executable)
