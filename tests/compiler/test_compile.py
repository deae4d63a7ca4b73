"""compile(): the pass list end to end, classification coverage, the --explain CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trnsim.compiler import PASSES, CompileError, compile, op_table, run_passes
from trnsim.compiler.__main__ import main
from trnsim.compiler.graph import GraphBuilder, TensorType, to_proto
from trnsim.protos import executable_pb2 as ex
from trnsim.protos import graph_pb2
from trnsim.simulator.config import TRN2

from .helpers import f32, mlp
from .test_memory_plan import check_schedule

REPO = Path(__file__).resolve().parents[2]

# ATen ops a GPT and a CNN reach in forward and backward (as seen by a PrivateUse1 backend).
TRANSFORMER_OPS = """aten::embedding.default aten::embedding_dense_backward.default
    aten::native_layer_norm.default aten::native_layer_norm_backward.default aten::addmm.default
    aten::mm.default aten::bmm.default aten::view.default aten::_unsafe_view.default
    aten::t.default aten::transpose.int aten::permute.default aten::expand.default
    aten::clone.default aten::_softmax.default aten::_softmax_backward_data.default
    aten::gelu.default aten::gelu_backward.default aten::add.Tensor aten::mul.Tensor
    aten::div.Tensor aten::sub.Tensor aten::masked_fill.Scalar aten::tril.default
    aten::_log_softmax.default aten::_log_softmax_backward_data.default
    aten::nll_loss_forward.default aten::nll_loss_backward.default aten::sum.dim_IntList
    aten::mean.dim aten::split.Tensor aten::cat.default aten::native_dropout.default
    aten::native_dropout_backward.default aten::_foreach_mul_.Scalar aten::_foreach_add_.List
    aten::_foreach_addcmul_.Scalar aten::_foreach_addcdiv_.ScalarList aten::_foreach_sqrt.default
    aten::_foreach_lerp_.Scalar aten::linalg_vector_norm.default aten::clamp.default
    aten::copy_.default aten::_to_copy.default aten::arange.start aten::rsqrt.default
    aten::_scaled_dot_product_flash_attention_for_cpu.default aten::slice.Tensor
    aten::select.int aten::unsqueeze.default aten::squeeze.dim aten::zero_.default
    aten::fill_.Scalar aten::where.self aten::pow.Tensor_Scalar aten::reciprocal.default
    aten::tanh.default aten::tanh_backward.default aten::silu.default aten::silu_backward.default"""
CNN_OPS = """aten::convolution.default aten::convolution_backward.default
    aten::native_batch_norm.default aten::native_batch_norm_backward.default
    aten::_native_batch_norm_legit_functional.default aten::relu.default aten::relu_.default
    aten::threshold_backward.default aten::max_pool2d_with_indices.default
    aten::max_pool2d_with_indices_backward.default aten::avg_pool2d.default
    aten::_adaptive_avg_pool2d.default aten::_adaptive_avg_pool2d_backward.default
    aten::mean.dim aten::flatten.using_ints aten::sigmoid.default aten::sigmoid_backward.default"""


@pytest.mark.parametrize("op", (TRANSFORMER_OPS + " " + CNN_OPS).split())
def test_classification_table_covers_training_ops(op):
    assert op_table.is_known(op), f"{op} falls back to GENERIC"


def test_classes_land_on_the_documented_engines():
    C = ex.InstructionClass
    assert op_table.classify("aten::mm.default") == C.MATMUL
    assert op_table.classify("aten::convolution.default") == C.MATMUL
    assert op_table.classify("aten::exp.default") == C.ACTIVATION
    assert op_table.classify("aten::add_.Tensor") == C.TENSOR_TENSOR
    assert op_table.classify("aten::_foreach_add_.List") == C.TENSOR_TENSOR
    assert op_table.classify("aten::_softmax.default") == C.REDUCTION
    assert op_table.classify("aten::index_select.default") == C.GPSIMD_OP
    assert op_table.classify("aten::view.default") == C.VIEW
    assert op_table.classify("aten::frobnicate.default") == C.GENERIC


def test_unknown_op_compiles_as_generic():
    b = GraphBuilder()
    x = b.input([128, 128])
    g = b.build(b.op("mylib::frobnicate.default", x, out=f32(128, 128)))
    exe = compile(g, "trn2")
    classes = {ex.InstructionClass.Name(i.klass) for i in exe.instructions}
    assert "GENERIC" in classes and exe.modelled_ns > 0


def test_pass_list_is_ordered_and_logged():
    names = [name for name, _ in PASSES]
    assert names == [
        "canonicalize",
        "dead code elimination",
        "common subexpression elimination",
        "classify",
        "fuse",
        "memory plan",
        "lower",
        "list schedule",
        "schedule search",
        "compile time",
        "emit",
    ]
    c = run_passes(mlp(), "trn2")
    assert [line.split(":")[0] for line in c.log] == names


def test_executable_carries_ops_cycles_and_memory_plan():
    exe = compile(to_proto(mlp()), "trn2", debug=None)
    assert exe.target == "trn2" and exe.format_version >= 1 and exe.cache_key
    compute = [i for i in exe.instructions if i.ops]
    assert sorted(op.op for i in compute for op in i.ops) == sorted(n.op for n in mlp().nodes)
    matmuls = [i for i in exe.instructions if i.klass == ex.MATMUL]
    assert len(matmuls) == 2 and all(i.engine == ex.TENSOR and i.cycles > 0 for i in matmuls)
    assert all(
        i.engine == ex.DMA for i in exe.instructions if i.klass in (ex.DMA_LOAD, ex.DMA_STORE)
    )
    matmul_flops, elementwise = 2 * 2 * 64 * 256 * 1024, 64 * 1024 + 64 * 256  # relu, add
    assert exe.memory_plan.hbm_io_bytes > 0 and exe.flops == matmul_flops + elementwise
    assert len(exe.input_buffers) == 3 and len(exe.output_buffers) == 1
    check_schedule(exe)


def test_compile_is_deterministic():
    a = compile(mlp(), "trn2").SerializeToString(deterministic=True)
    b = compile(mlp(), "trn2").SerializeToString(deterministic=True)
    assert a == b


def test_debug_map_from_instruction_to_source():
    debug = graph_pb2.GraphDebug(name="step")
    for i in range(len(mlp().nodes)):
        debug.node_locations.add(file="train.py", line=10 + i)
    exe = compile(mlp(), "trn2", ex.CompileOptions(emit_debug_info=True), debug)
    mm = next(i for i in exe.instructions if i.klass == ex.MATMUL)
    entry = next(d for d in exe.debug.instructions if d.instruction == mm.id)
    assert exe.debug.graph.node_locations[entry.nodes[0]].line == 10 + mm.nodes[0]
    plain = compile(mlp(), "trn2", ex.CompileOptions(), debug)
    assert not plain.debug.graph.node_locations and plain.cache_key == exe.cache_key


def test_large_gemm_executable_near_peak():
    b = GraphBuilder()
    x = b.input([4096, 4096], "bfloat16")
    w = b.input([4096, 4096], "bfloat16")
    g = b.build(b.op("aten::mm.default", x, w, out=TensorType.contiguous([4096, 4096], "bfloat16")))
    exe = compile(g, "trn2")
    tflops = exe.flops / exe.modelled_ns / 1000
    assert 0.9 * TRN2.peak_bf16_tflops <= tflops <= TRN2.peak_bf16_tflops, tflops


def test_malformed_graph_is_a_compile_error():
    bad = graph_pb2.Graph()
    bad.nodes.add(op="aten::neg.default").args.add().tensor.input = 5
    with pytest.raises(CompileError, match="malformed graph"):
        compile(bad, "trn2")


def test_explain_cli(capsys):
    assert main(["--explain", str(REPO / "examples" / "graphs" / "mlp.json")]) == 0
    out = capsys.readouterr().out
    for expected in (
        "passes:",
        "dead code elimination: 9 -> 8",
        "TENSOR",
        "modelled time:",
        "peak memory:",
    ):
        assert expected in out


def test_explain_cli_reports_errors(capsys, tmp_path):
    assert main(["--explain", str(tmp_path / "missing.json")]) == 2
    assert "error:" in capsys.readouterr().err


def test_importing_the_compiler_does_not_import_torch():
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import trnsim.compiler"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "trnsim.compiler" in imported
    assert not {m for m in imported if m == "torch" or m.startswith(("torch.", "grpc"))}


def test_a_gemm_rereads_an_operand_only_when_neither_fits_sbuf():
    from trnsim.compiler.lower import gemm_reload_bytes

    sbuf = 24 << 20
    # 4 MiB x 8 MiB (BERT-Large's FFN): the smaller one stays resident, each is read once.
    assert gemm_reload_bytes(op_table.GemmShape(1, 2048, 1024, 4096), 2, sbuf) == 0
    # 64 MiB x 64 MiB: the streamed operand is read again for every further 12 MiB panel.
    big = op_table.GemmShape(1, 8192, 4096, 8192)
    reloads = gemm_reload_bytes(big, 2, sbuf)
    assert reloads == (64 << 20) * (-(-8192 // 1536) - 1)
    assert gemm_reload_bytes(op_table.GemmShape(3, 8192, 4096, 8192), 2, sbuf) == 3 * reloads
