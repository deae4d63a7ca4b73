"""torch.autocast("neuron"): matmul-class ops run in the autocast dtype, precision-sensitive
ops in float32, following CUDA's autocast op lists."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch
from trnsim.client.core.types import Op, OpValue

# CUDA's lower_precision_fp list (aten/src/ATen/autocast_mode.cpp), ops that exist as aten ops.
LOWER_PRECISION = [
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
]
# CUDA's fp32 list: ops whose results lose too much in 16 bits.
FLOAT32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "cross_entropy_loss",
    "norm.Scalar",
    "norm.ScalarOpt_dim",
    "prod",
    "sum.default",
    "sum.dim_IntList",
    "linalg_vector_norm",
]

_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _cast(value: OpValue, dtype: torch.dtype) -> OpValue:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype != dtype and value.device.type == "neuron":
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _kernel(op: Op, fixed: torch.dtype | None) -> Callable[..., OpValue]:
    def autocast_kernel(*args: OpValue, **kwargs: OpValue) -> OpValue:
        dtype = fixed or torch.get_autocast_dtype("neuron")
        args = _cast(args, dtype)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
            return op(*args, **kwargs)

    return autocast_kernel


def _overloads(name: str) -> list[tuple[str, Op]]:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return []
    out = []
    for o in [overload] if overload else packet.overloads():
        qualified = f"{base}.{o}" if o != "default" else base
        try:
            torch._C._dispatch_find_schema_or_throw(f"aten::{base}", "" if o == "default" else o)
        except RuntimeError:
            continue  # a Python-only overload (einsum.sublist), not an operator
        out.append((qualified, getattr(packet, o)))
    return out


_thread = threading.local()


def _default_bfloat16() -> None:
    """torch.autocast("neuron") without a dtype means bfloat16, the NeuronCore's native type
    (PyTorch's per-thread default for PrivateUse1 is float16, and no backend hook sets it):
    set for this thread here, and for autocast regions entered on any other thread by
    bfloat16_first (client/api/patches.py wraps autocast.__init__ with it)."""
    torch.set_autocast_dtype("neuron", torch.bfloat16)
    _thread.defaulted = True


AutocastInit = Callable[..., None]  # torch.amp.autocast_mode.autocast.__init__


def bfloat16_first(original: AutocastInit) -> AutocastInit:
    """autocast.__init__, setting bfloat16 as the thread's neuron default on its first
    autocast on neuron."""

    @functools.wraps(original)
    def __init__(
        self: torch.amp.autocast_mode.autocast,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        # A thread's first autocast on neuron finds PyTorch's per-thread default (float16)
        # unless its program set one: bfloat16 then, once; torch.set_autocast_dtype wins.
        if device_type == "neuron" and not getattr(_thread, "defaulted", False):
            _thread.defaulted = True
            if torch.get_autocast_dtype("neuron") == torch.float16:
                torch.set_autocast_dtype("neuron", torch.bfloat16)
        original(self, device_type, dtype, enabled, cache_enabled)

    return __init__


def register() -> torch.library.Library:
    """Autocast kernels for both lists; every other op falls through. The default dtype is
    bfloat16."""
    _default_bfloat16()
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    lib._fallthrough = fallthrough  # keep both alive together
    for names, dtype in ((LOWER_PRECISION, None), (FLOAT32, torch.float32)):
        for name in names:
            for qualified, op in _overloads(name):
                if torch._C._dispatch_has_kernel_for_dispatch_key(
                    f"aten::{qualified}", "AutocastPrivateUse1"
                ):
                    continue
                lib.impl(qualified, _kernel(op, dtype), "AutocastPrivateUse1")
    return lib
