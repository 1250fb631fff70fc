"""Pure-torch fp32 reference of ``fp8_decode_moe``: what the kernels must match within the tests'
tolerance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp8_decode.layer import check_inputs
from moetune.quant.fp8_block import dequantize_fp8_block


def fp8_decode_moe_reference(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                             w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                             activation: str = "silu", swiglu_limit: float | None = None,
                             config: Mapping[str, Any] | None = None, fused: bool = False,
                             validate: bool = False, pdl: bool = False) -> torch.Tensor:
    """fp32 torch on the dequantized weights of the experts actually routed to (``config``, ``fused``,
    ``validate`` and ``pdl`` are ignored); inactive routes contribute 0 and their experts' storage is
    never read."""
    m, h, e, inter, top_k = check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                         activation, swiglu_limit)
    out = torch.zeros(m, h, dtype=torch.float32, device=x.device)
    xf = x.float()
    for expert in torch.unique(topk_ids[topk_ids >= 0]).tolist():
        tok, slot = (topk_ids == expert).nonzero(as_tuple=True)
        g13 = dequantize_fp8_block(w13[expert], w13_scale[expert])
        g2 = dequantize_fp8_block(w2[expert], w2_scale[expert])
        gu = xf[tok] @ g13.T
        act = gated_activation(gu[:, :inter], gu[:, inter:], activation, swiglu_limit)
        if x.dtype != torch.float32:  # the kernel feeds the down GEMM in the activation dtype
            act = act.to(x.dtype).float()
        y = (act @ g2.T) * topk_weights[tok, slot, None]
        out.index_add_(0, tok, y)
    return out.to(x.dtype)
