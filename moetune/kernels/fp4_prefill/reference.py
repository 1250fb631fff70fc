"""The FP4 prefill MoE in pure torch (fp32 math on the dequantized weights): what ``fp4_prefill_moe`` is
checked against; and the route alignment in torch ops, what ``align_routes`` is checked against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.kernels.activations import check_activation, gated_activation
from moetune.kernels.fp4_prefill.align import Alignment, max_slots
from moetune.kernels.fp4_prefill.inputs import check_biases, check_inputs, check_scale_max
from moetune.quant.fp8_act import dequantize_fp8_act, quantize_fp8_act
from moetune.quant.mxfp4 import dequantize_mxfp4


def fp4_prefill_moe_reference(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                              w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                              topk_ids: torch.Tensor, *, activation: str = "silu",
                              swiglu_limit: float | None = None,
                              config: Mapping[str, Any] | None = None, validate: bool = False,
                              w13_bias: torch.Tensor | None = None,
                              w2_bias: torch.Tensor | None = None,
                              w13_scale_max: torch.Tensor | None = None,
                              w2_scale_max: torch.Tensor | None = None) -> torch.Tensor:
    """Pure torch, fp32: dequantized weights (any K padding dropped), the same activation quantization;
    ``config`` and the scales' row maxima (checked as the layer checks them) are not used. Per route: ``h =
    act(x W13^T + w13_bias) * weight``, ``out += h W2^T + weight * w2_bias``."""
    experts, inter, _, _ = check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                        topk_ids)
    check_activation(activation, swiglu_limit)
    check_biases(w13_bias, w2_bias, experts, inter, x.shape[1], x.device)
    check_scale_max(w13_scale_max, w2_scale_max, w13_scale, w2_scale)
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


def align_routes_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """``align_routes`` in eager torch ops: the same bytes (a stable sort by expert)."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    routes = flat.numel()
    # Inactive (-1) and out-of-range ids go to a dump bin E that is never padded or launched.
    key = torch.where((flat >= 0) & (flat < num_experts), flat, torch.full_like(flat, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    rank = torch.arange(routes, device=dev) - cnt_start[sorted_key]
    slots = max_slots(routes, num_experts, block_m)
    start = torch.cat((pad_start, pad_start.new_full((1,), slots)))  # dump bin -> slot `slots`
    dest = torch.where(sorted_key < num_experts, start[sorted_key] + rank, slots)
    sorted_ids = torch.full((slots + 1,), routes, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(slots // block_m, device=dev) * block_m
    expert = torch.searchsorted(pad_end, block_start, right=True)
    total = pad_end[-1:] if num_experts else torch.zeros(1, dtype=torch.long, device=dev)
    expert = torch.where(block_start < total, expert, torch.full_like(expert, -1))
    return Alignment(sorted_ids[:slots], expert.to(torch.int32), total.to(torch.int32), block_m, routes)
