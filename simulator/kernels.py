"""ATen ops that accelerator backends provide and the CPU does not: the executor's own
kernels for them, written with CPU ATen ops in the order the CUDA kernels compute.

- histc on integers (MoE routing in transformers counts expert ids with it);
- the fused LSTM and GRU cells and their backwards, which ATen's RNN code calls for every
  non-CPU device (nn.LSTM, nn.GRU, LSTMCell, GRUCell). Same gates, same workspace layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


def histc(input: Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:
    """Integers counted in float64 (exact for any count a histogram holds), returned in the
    input's dtype, as CUDA does."""
    cpu_histc = torch.ops.aten.histc.default
    counts: Tensor = cpu_histc(
        input if input.is_floating_point() else input.double(), bins, min, max
    )
    return counts.to(input.dtype)


def lstm_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    cx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(hy, cy, workspace): workspace holds the activated gates (i, f, c, o) for backward."""
    gates = input_gates + hidden_gates
    if input_bias is not None and hidden_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, c, o = gates.chunk(4, 1)
    ig, fg, cg, og = i.sigmoid(), f.sigmoid(), c.tanh(), o.sigmoid()
    cy = fg * cx + ig * cg
    hy = og * cy.tanh()
    return hy, cy, torch.cat([ig, fg, cg, og], 1)


def lstm_cell_backward(
    grad_hy: Tensor | None,
    grad_cy: Tensor | None,
    cx: Tensor,
    cy: Tensor,
    workspace: Tensor,
    has_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_gates, grad_cx, grad_bias) from the saved gates."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    ig, fg, cg, og = workspace.chunk(4, 1)
    go = grad_hy if grad_hy is not None else torch.zeros_like(cx)
    tanh_cy = cy.tanh()
    gcx = go * og * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcx = gcx + grad_cy
    gig = gcx * cg * (1 - ig) * ig
    gfg = gcx * cx * (1 - fg) * fg
    gcg = gcx * ig * (1 - cg * cg)
    gog = go * tanh_cy * (1 - og) * og
    grad_gates = torch.cat([gig, gfg, gcg, gog], 1)
    return grad_gates, gcx * fg, grad_gates.sum(0) if has_bias else None


def gru_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    hx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(hy, workspace): workspace holds r, z (input gate), n, hx and the hidden n gate."""
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    r, i = ir + hr, ii + hi
    if input_bias is not None and hidden_bias is not None:
        b1r, b1i, b1n = input_bias.chunk(3)
        b2r, b2i, b2n = hidden_bias.chunk(3)
        r, i, in_, hn = r + b1r + b2r, i + b1i + b2i, in_ + b1n, hn + b2n
    rg, ig = r.sigmoid(), i.sigmoid()
    ng = (in_ + rg * hn).tanh()
    hy = ng + ig * (hx - ng)
    return hy, torch.cat([rg, ig, ng, hx, hn], 1)


def gru_cell_backward(
    grad_hy: Tensor, workspace: Tensor, has_bias: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    rg, ig, ng, hx, hn = workspace.chunk(5, 1)
    gig = grad_hy * (hx - ng) * (1 - ig) * ig
    ghx = grad_hy * ig
    gin = grad_hy * (1 - ig) * (1 - ng * ng)
    ghn = gin * rg
    grg = gin * hn * (1 - rg) * rg
    grad_input = torch.cat([grg, gig, gin], 1)
    grad_hidden = torch.cat([grg, gig, ghn], 1)
    if not has_bias:
        return grad_input, grad_hidden, ghx, None, None
    return grad_input, grad_hidden, ghx, grad_input.sum(0), grad_hidden.sum(0)


# ATen overload -> its kernel here.
GAPS: dict[str, Callable[..., Any]] = {
    "aten::histc": histc,
    "aten::histc.default": histc,
    "aten::_thnn_fused_lstm_cell.default": lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl.default": lstm_cell_backward,
    "aten::_thnn_fused_gru_cell.default": gru_cell,
    "aten::_thnn_fused_gru_cell_backward.default": gru_cell_backward,
}
