"""The FP4 prefill MoE in pure torch (fp32 math on the dequantized weights): what ``fp4_prefill_moe`` is
checked against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.kernels.activations import check_activation, gated_activation
from moetune.kernels.fp4_prefill.inputs import check_biases, check_inputs
from moetune.quant.fp8_act import dequantize_fp8_act, quantize_fp8_act
from moetune.quant.mxfp4 import dequantize_mxfp4


def fp4_prefill_moe_reference(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                              w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                              topk_ids: torch.Tensor, *, activation: str = "silu",
                              swiglu_limit: float | None = None,
                              config: Mapping[str, Any] | None = None, validate: bool = False,
                              w13_bias: torch.Tensor | None = None,
                              w2_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure torch, fp32: dequantized weights (any K padding dropped), the same activation quantization;
    ``config`` is ignored. Per route: ``h = act(x W13^T + w13_bias) * weight``, ``out += h W2^T + weight *
    w2_bias``."""
    experts, inter, _, _ = check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                        topk_ids)
    check_activation(activation, swiglu_limit)
    check_biases(w13_bias, w2_bias, experts, inter, x.shape[1], x.device)
    m, h = x.shape
    out = torch.zeros(m, h, dtype=torch.float32, device=x.device)
    if m == 0:
        return out.to(x.dtype)
    xd = dequantize_fp8_act(*quantize_fp8_act(x))
    ids = topk_ids.long()
    if validate and ((ids < -1) | (ids >= experts)).any():
        raise ValueError(f"topk_ids has ids outside [-1, {experts})")
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gu = xd[tok] @ dequantize_mxfp4(w13_packed[e], w13_scale[e])[:, :h].T
        if w13_bias is not None:
            gu = gu + w13_bias[e].float()
        weight = topk_weights[tok, slot].float().unsqueeze(1)
        act = gated_activation(gu[:, :inter], gu[:, inter:], activation, swiglu_limit) * weight
        hd = dequantize_fp8_act(*quantize_fp8_act(act))
        y = hd @ dequantize_mxfp4(w2_packed[e], w2_scale[e])[:, :inter].T
        if w2_bias is not None:
            y = y + weight * w2_bias[e].float()
        out.index_add_(0, tok, y)
    return out.to(x.dtype)
