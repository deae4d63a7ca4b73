"""A representative subset of PyTorch's OpInfo database on neuron vs CPU (float32 forward).

The whole database runs with `make conformance` (tests/conformance.py)."""

from __future__ import annotations

import pytest

from tests.conformance import float32_ops, run_op

SUBSET = [
    "add",
    "sub",
    "mul",
    "div",
    "true_divide",
    "pow",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "sin",
    "cos",
    "clamp",
    "where",
    "maximum",
    "minimum",
    "eq",
    "lt",
    "ge",
    "logical_and",
    "masked_fill",
    "addcmul",
    "addcdiv",
    "lerp",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "nn.functional.linear",
    "einsum",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.silu",
    "nn.functional.softplus",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.batch_norm",
    "nn.functional.group_norm",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "nn.functional.nll_loss",
    "nn.functional.mse_loss",
    "nn.functional.conv2d",
    "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d",
    "nn.functional.dropout",
    "nn.functional.pad",
    "nn.functional.interpolate",
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "std",
    "prod",
    "cumsum",
    "logsumexp",
    "norm",
    "linalg.vector_norm",
    "cat",
    "stack",
    "split",
    "chunk",
    "transpose",
    "permute",
    "reshape",
    "view",
    "flatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_put",
    "index_add",
    "take_along_dim",
    "masked_select",
    "nonzero",
    "topk",
    "sort",
    "tril",
    "triu",
    "flip",
    "roll",
    "repeat",
    "narrow",
    "select",
    "arange",
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "randn_like",
    "bernoulli",
    "fft.fft",
    "fft.ifft",
]


def _ops():
    return float32_ops(SUBSET)


def test_subset_names_exist():
    found = {op.name for op in _ops()}
    assert set(SUBSET) <= found, sorted(set(SUBSET) - found)


@pytest.mark.parametrize(
    "op",
    _ops(),
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_opinfo_float32_samples_match_cpu_and_adaptive_matches_eager(op):
    """Each sample in eager mode against the CPU, then in adaptive mode (recorded, fused
    once compiled) against eager mode, bit for bit."""
    result = run_op(op, timeout=120, mode="adaptive")
    assert result.passed, result.reason
    assert result.samples > 0, "no sample ran on neuron"


@pytest.mark.slow
def test_the_whole_database_passes_at_least_90_percent_and_adaptive_as_eager():
    """All float32 OpInfo ops, each in a worker process (`make test-slow`): every sample
    against the CPU in eager mode, then against eager in adaptive mode. No op may fail
    because of adaptive mode."""
    from tests.conformance import run_all

    results = run_all([], timeout=120, progress=False, mode="adaptive")
    failed = [f"{r.name}: {r.reason}" for r in results if not r.passed]
    assert len(results) - len(failed) >= 0.9 * len(results), failed
    assert not [f for f in failed if "AdaptiveModeError" in f], failed


# Forward-mode AD, double backward and sparse samples: the whole database with
# `python tests/conformance.py --forward-ad / --gradgrad / --sparse`; here one of each kind.
DERIVATIVE_SUBSET = [
    "sin",
    "mul",
    "matmul",
    "nn.functional.layer_norm",
    "nn.functional.conv2d",
    "softmax",
    "cumsum",
    "index_put",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
]
SPARSE_SUBSET = ["sin", "mul", "sum", "sparse.mm", "sparse.sampled_addmm", "to_sparse", "abs"]


@pytest.mark.parametrize("check", ["forward_ad", "gradgrad"])
@pytest.mark.parametrize(
    "op",
    float32_ops(DERIVATIVE_SUBSET),
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_opinfo_derivatives_match_cpu(op, check):
    """Forward-mode derivatives (dual tensors) and double backward on neuron against the
    CPU's, and in adaptive mode against eager, bit for bit."""
    if op not in float32_ops([op.name], check):
        pytest.skip(f"OpInfo says {op.name} does not support {check}")
    result = run_op(op, timeout=120, mode="adaptive", check=check)
    assert result.passed, result.reason
    assert result.samples > 0, "no sample ran on neuron"


@pytest.mark.filterwarnings("ignore:Sparse")
@pytest.mark.parametrize(
    "op",
    float32_ops(SPARSE_SUBSET),
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_opinfo_sparse_samples_match_cpu(op):
    """Sparse samples (every layout the op supports) on neuron against the CPU; ops whose
    ordinary samples hold sparse tensors (sparse.mm) run their ordinary samples."""
    sparse = op in float32_ops([op.name], "sparse")
    result = run_op(op, timeout=120, mode="adaptive", check="sparse" if sparse else "forward")
    assert result.passed, result.reason
    assert result.samples > 0, "no sample ran on neuron"
