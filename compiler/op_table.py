"""Which engine and instruction class computes each ATen op, and how much work it is.

The table covers the ops a transformer, a CNN and their backward passes reach; an op it
does not know is priced as a GENERIC Vector-engine op over its bytes, never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnsim.protos import executable_pb2 as ex

C = ex.InstructionClass

_MATMUL = """mm bmm addmm baddbmm addbmm addmv mv dot matmul linear _addmm_activation
    convolution _convolution conv1d conv2d conv3d convolution_backward conv_transpose2d
    scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
    _scaled_dot_product_attention_math _scaled_dot_product_flash_attention_for_cpu_backward
    _scaled_dot_product_efficient_attention_backward _scaled_dot_product_flash_attention_backward
    outer ger _int_mm tensordot"""
_TRANSPOSE = "transpose_copy permute_copy t_copy"
_TENSOR_TENSOR = """add sub rsub mul div true_divide floor_divide remainder fmod where maximum minimum
    fmax fmin eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or
    bitwise_xor bitwise_not logical_not addcmul addcdiv lerp pow atan2 hypot copysign
    masked_fill threshold_backward hardtanh_backward leaky_relu_backward elu_backward
    hardsigmoid_backward hardswish_backward xlogy mse_loss mse_loss_backward smooth_l1_loss
    smooth_l1_loss_backward huber_loss l1_loss isnan isinf isfinite signbit heaviside
    logaddexp clamp_min clamp_max"""
_TENSOR_SCALAR = """neg abs sign clamp clip fill zero zeros_like ones_like full_like floor ceil round
    trunc frac relu hardtanh leaky_relu threshold scalar_tensor square positive nan_to_num
    lift_fresh_copy"""
_ACTIVATION = """exp exp2 expm1 log log2 log10 log1p tanh sigmoid gelu silu mish softplus elu selu
    celu hardsigmoid hardswish sqrt rsqrt erf erfc erfinv sin cos tan asin acos atan sinh cosh
    asinh acosh atanh gelu_backward silu_backward sigmoid_backward tanh_backward
    softplus_backward mish_backward logit sinc special_erfcx _log_softmax_backward_data
    log_sigmoid_forward log_sigmoid_backward"""
_RECIPROCAL = "reciprocal"
_REDUCTION = """sum mean amax amin max min argmax argmin prod all any var std var_mean std_mean
    norm linalg_vector_norm logsumexp cumsum cumprod _softmax _log_softmax softmax log_softmax
    _softmax_backward_data nll_loss_forward nll_loss_backward nll_loss nll_loss2d_forward
    nll_loss2d_backward cross_entropy_loss binary_cross_entropy
    binary_cross_entropy_with_logits binary_cross_entropy_backward count_nonzero
    aminmax cummax cummin _euclidean_dist cdist dist kl_div"""
_NORMALIZATION = """native_layer_norm native_layer_norm_backward native_batch_norm
    native_batch_norm_backward _native_batch_norm_legit _native_batch_norm_legit_no_training
    _native_batch_norm_legit_functional batch_norm_backward native_group_norm
    native_group_norm_backward _fused_rms_norm _fused_rms_norm_backward rms_norm layer_norm
    group_norm batch_norm instance_norm"""
_GPSIMD = """index_select gather scatter scatter_add scatter_reduce index index_put index_add
    index_copy index_fill embedding embedding_dense_backward embedding_backward arange iota
    tril triu topk sort argsort nonzero masked_select masked_scatter take put
    rand randn rand_like randn_like randint randint_like randperm bernoulli normal uniform
    exponential geometric cauchy log_normal multinomial native_dropout native_dropout_backward
    dropout _fused_dropout unique _unique2 unique_consecutive bincount histc searchsorted
    bucketize linspace logspace eye one_hot _local_scalar_dense max_pool2d_with_indices
    max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward adaptive_avg_pool2d
    _adaptive_avg_pool2d _adaptive_avg_pool2d_backward adaptive_max_pool2d upsample_nearest2d
    upsample_bilinear2d grid_sampler_2d im2col col2im"""
_DMA = """copy _copy_from _to_copy clone contiguous cat stack expand_copy flip roll repeat
    constant_pad_nd pad reflection_pad2d replication_pad2d slice_scatter select_scatter
    as_strided_scatter diagonal_scatter _to_dense new_zeros new_ones new_full zeros ones full
    resize_ set_ alias_copy
    view_copy _unsafe_view_copy repeat_interleave tile narrow_copy block_diag cartesian_prod
    _foreach_copy detach_copy"""
_VIEW = """view _unsafe_view reshape expand expand_as permute transpose t slice select squeeze
    unsqueeze as_strided alias detach unfold split split_with_sizes chunk narrow diagonal
    view_as_real view_as_complex unbind _reshape_alias lift_fresh movedim swapaxes
    numpy_T mT mH _indices _values real imag conj _conj _neg_view resolve_conj resolve_neg
    unsafe_split unsafe_chunk tensor_split hsplit vsplit flatten unflatten view_as ravel"""
# Allocations: no device work (priced like views).
_ALLOC = "empty empty_like empty_strided new_empty new_empty_strided"
_COLLECTIVE = """all_reduce all_gather_into_tensor reduce_scatter_tensor all_to_all_single broadcast
    all_reduce_coalesced all_gather_into_tensor_coalesced reduce_scatter_tensor_coalesced
    wait_tensor allreduce_ allgather_ reduce_scatter_ broadcast_ alltoall_base_ barrier"""

# Ops that must run even when nothing reads their outputs (RNG state, communication).
_RANDOM = """rand randn rand_like randn_like randint randint_like randperm bernoulli normal uniform
    exponential geometric cauchy log_normal multinomial native_dropout dropout _fused_dropout
    rrelu_with_noise"""
# native_batch_norm updates its running stats in place although its schema does not say so.
_STATEFUL = """_assert_async _assert_scalar _print copy _copy_from set_ resize_ native_batch_norm
    batch_norm_update_stats"""
_SIDE_EFFECTS = (
    frozenset(_RANDOM.split()) | frozenset(_STATEFUL.split()) | frozenset(_COLLECTIVE.split())
)


def _table() -> dict[str, int]:
    table: dict[str, int] = {}
    for names, klass in (
        (_MATMUL, C.MATMUL),
        (_TRANSPOSE, C.TRANSPOSE),
        (_TENSOR_TENSOR, C.TENSOR_TENSOR),
        (_TENSOR_SCALAR, C.TENSOR_SCALAR),
        (_ACTIVATION, C.ACTIVATION),
        (_RECIPROCAL, C.ACTIVATION),
        (_REDUCTION, C.REDUCTION),
        (_NORMALIZATION, C.NORMALIZATION),
        (_GPSIMD, C.GPSIMD_OP),
        (_DMA, C.DMA_COPY),
        (_VIEW, C.VIEW),
        (_ALLOC, C.VIEW),
        (_COLLECTIVE, C.COLLECTIVE),
    ):
        for name in names.split():
            assert name not in table, f"{name} is in two classes"
            table[name] = klass
    return table


TABLE = _table()
RECIPROCAL_OPS = frozenset(_RECIPROCAL.split())


def base_name(op: str) -> str:
    """ "aten::add_.Tensor" -> "add"; "aten::_foreach_mul_.Scalar" -> "mul"; keeps "_softmax"."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    name = name.removeprefix("_foreach_")
    if name.endswith("_") and not name.endswith("__") and name[:-1] in TABLE:
        name = name[:-1]
    return name


def classify(op: str) -> int:
    """The InstructionClass of an op; GENERIC for ops the table does not know."""
    return TABLE.get(base_name(op), C.GENERIC)


# In-place ops that overwrite their destination whole: they write it without reading it.
_OVERWRITES = frozenset(["copy", "fill", "zero"])


def overwrites_destination(op: str) -> bool:
    return base_name(op) in _OVERWRITES


def has_side_effects(op: str) -> bool:
    return base_name(op) in _SIDE_EFFECTS


_NOT_FUSIBLE = frozenset(
    ["_assert_async", "_assert_scalar", "_print", "_local_scalar_dense", "set_", "resize_", "item"]
)


def is_random(op: str) -> bool:
    return base_name(op) in _RANDOM_OPS


_RANDOM_OPS = frozenset(_RANDOM.split())


def fusible(op: str) -> bool:
    """Whether the op may be part of a recorded graph (adaptive mode): everything but
    communication and host-visible side effects."""
    name = base_name(op)
    return TABLE.get(name) != C.COLLECTIVE and name not in _NOT_FUSIBLE


def is_known(op: str) -> bool:
    return base_name(op) in TABLE


ENGINE_OF_CLASS: dict[int, str] = {
    C.MATMUL: "tensor",
    C.TRANSPOSE: "tensor",
    C.TENSOR_TENSOR: "vector",
    C.TENSOR_SCALAR: "vector",
    C.REDUCTION: "vector",
    C.NORMALIZATION: "vector",
    C.GENERIC: "vector",
    C.ACTIVATION: "scalar",
    C.GPSIMD_OP: "gpsimd",
    C.DMA_COPY: "dma",
    C.COLLECTIVE: "dma",
    C.VIEW: "none",
}


@dataclass(frozen=True)
class GemmShape:
    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


def gemm_shapes(
    op: str, inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]
) -> list[GemmShape]:
    """The GEMMs a MATMUL-class op performs, from its tensor argument and output shapes."""
    name = base_name(op)
    a = inputs
    if name in ("addmm", "_addmm_activation") and len(a) >= 3:
        return [_mm(a[1], a[2])]
    if name in ("baddbmm", "addbmm") and len(a) >= 3:
        return [_bmm(a[1], a[2])]
    if name in ("addmv",) and len(a) >= 3:
        return [GemmShape(1, a[1][0], a[1][-1], 1)]
    if name == "linear" and len(a) >= 2:
        x, w = a[0], a[1]
        return [GemmShape(1, math.prod(x[:-1]), x[-1] if x else 1, w[0] if w else 1)]
    if name.startswith(("conv", "_conv")):
        return _conv(name, a, outputs)
    if "attention" in name:
        return _attention(a)
    if len(a) >= 2:
        return [_matmul(a[0], a[1])]
    out = outputs[0] if outputs else (1,)
    return [GemmShape(1, math.prod(out), 1, 1)]


def _mm(x: tuple[int, ...], y: tuple[int, ...]) -> GemmShape:
    return GemmShape(1, x[0] if len(x) > 1 else 1, x[-1] if x else 1, y[-1] if len(y) > 1 else 1)


def _bmm(x: tuple[int, ...], y: tuple[int, ...]) -> GemmShape:
    return GemmShape(x[0], x[-2], x[-1], y[-1])


def _matmul(x: tuple[int, ...], y: tuple[int, ...]) -> GemmShape:
    if len(x) <= 2 and len(y) <= 2:
        return _mm(x, y)
    m = x[-2] if len(x) >= 2 else 1
    n = y[-1] if len(y) >= 2 else 1
    batch = max(math.prod(x[:-2]), math.prod(y[:-2]))
    return GemmShape(batch, m, x[-1], n)


def _conv(name: str, a: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> list[GemmShape]:
    """Convolution as an implicit GEMM: (N*spatial_out) x (Cin*kernel) x Cout."""
    if name == "convolution_backward" and len(a) >= 3:
        grad_out, weight = a[0], a[2]
        fwd = GemmShape(1, grad_out[0] * math.prod(grad_out[2:]), math.prod(weight[1:]), weight[0])
        return [fwd, fwd]  # grad_input and grad_weight GEMMs
    if len(a) < 2 or not outputs:
        return [GemmShape(1, 1, 1, 1)]
    weight, out = a[1], outputs[0]
    return [GemmShape(1, out[0] * math.prod(out[2:]), math.prod(weight[1:]), weight[0])]


def _attention(a: list[tuple[int, ...]]) -> list[GemmShape]:
    """Q K^T then P V, batched over batch x heads."""
    if len(a) < 3 or len(a[0]) < 2:
        return [GemmShape(1, 1, 1, 1)]
    q, k = a[0], a[1]
    batch, length, dim, s = math.prod(q[:-2]), q[-2], q[-1], k[-2]
    return [GemmShape(batch, length, dim, s), GemmShape(batch, length, s, dim)]
