"""Fused attention for neuron tensors: scaled_dot_product_attention takes the backend the
CPU would take for the same shapes, dtypes and arguments.

PyTorch picks SDPA's backend through a C++ dispatch stub that only a C++ backend can fill;
for a Python backend it always picks the math decomposition, which materialises the
(batch, heads, sequence, sequence) attention matrix in HBM, forward and backward: 512 MiB
per layer for a Llama 1B at 2048 tokens, where Trainium's fused attention kernels keep it
in SBUF. So the op is registered for the device here (AutogradPrivateUse1 and PrivateUse1):
where the CPU's choice (`_fused_sdp_choice`) is flash attention, it runs the CPU's flash
kernel (`_scaled_dot_product_flash_attention_for_cpu`, with its own backward): one op,
priced as a fused attention kernel (compiler/op_table.py), its results bit for bit the
CPU's; otherwise the math decomposition, as before. Under torch.compile the same choice is
made from the inputs' metadata.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION


def _choice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    causal: bool,
    **kw: float | bool | None,
) -> int:
    """The backend the CPU would choose, asked of CPU stand-ins of the same geometry that
    require gradients where the inputs do. (Not of the device's own tensors: the CPU kernel
    of `_fused_sdp_choice` would see their host aliases, which never require gradients, and
    a mask that does must go to math, flash attention having no gradient for it: BEiT's
    relative position bias. Nor of fake and functional tensors while tracing: they would get
    the Meta kernel's answer, which is always math.)"""
    choose = torch.ops.aten._fused_sdp_choice.default
    with _disable_current_modes():
        try:
            stand = [_stand_in(t) for t in (q, k, v)]
            m = None if mask is None else _stand_in(mask)
        except TypeError:  # (symbolic sizes: the math decomposition, as before)
            return 0
        return int(choose(*stand, m, dropout_p, causal, **kw))


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of t's geometry over memory that is never touched (a symbolic size at
    the value it was traced with, without a guard that would specialise it), requiring
    gradients where t does."""
    shape = [_hint(s) for s in t.shape]
    stride = [_hint(s) for s in t.stride()]
    grad = t.requires_grad and (t.is_floating_point() or t.is_complex())
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="cpu", requires_grad=grad)


def _hint(size: torch.SymInt | int) -> int:
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise TypeError("a symbolic size without a hint")
        return int(hint)
    return int(size)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    kw = {"scale": scale, "enable_gqa": enable_gqa}
    choice = _choice(query, key, value, attn_mask, dropout_p, is_causal, **kw)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # (as PyTorch's own SDPA does before any backend: False is -inf, True is 0)
        additive = torch.zeros_like(attn_mask, dtype=query.dtype)
        attn_mask = additive.masked_fill_(attn_mask.logical_not(), float("-inf"))
    if choice == _FLASH:
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return out  # type: ignore[no-any-return]
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, **kw
    )
    return out  # type: ignore[no-any-return]


def register() -> torch.library.Library:
    lib = torch.library.Library("aten", "IMPL")
    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, key)
    return lib
