"""The routed MoE's last step: each token's output is the sum of its routes' rows.

``out[t] = sum_j rows[t * top_k + j]`` over the token's active routes (``topk_ids[t, j] >= 0``), added in
fp32 in route order and stored in the output's dtype. Inactive routes' rows are never read, so the GEMM
before it need not write them (nor anything zero them): at 24576 routes of a 4096-wide layer that is a
403 MB memset saved, and the dtype cast rides along instead of a pass of its own. The down GEMM's optional
per-expert bias rides along too: each active route adds its routing weight times its expert's bias row.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from moetune.device import interpreter_active

BLOCK_H = 1024


@triton.jit
def _moe_sum_kernel(rows_ptr, ids_ptr, w_ptr, b_ptr, out_ptr, H, experts, stride_r, stride_o, stride_w,
                    stride_be, stride_bh, TOP_K: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    """HAS_BIAS: each active route also adds ``w[route] * b[expert]``."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        route = t * TOP_K + j
        e = tl.load(ids_ptr + route + tl.zeros([BLOCK], tl.int32))  # (one line, read by all)
        active = e >= 0
        row = tl.load(rows_ptr + route.to(tl.int64) * stride_r + cols, mask=in_row & active, other=0.0)
        acc += row.to(tl.float32)
        if HAS_BIAS:  # an id past the experts (undefined, caught by validate=True) reads no bias
            ok = in_row & active & (e < experts)
            w = tl.load(w_ptr + route.to(tl.int64) * stride_w + tl.zeros([BLOCK], tl.int32), mask=ok,
                        other=0.0)
            b = tl.load(b_ptr + e.to(tl.int64) * stride_be + cols * stride_bh, mask=ok, other=0.0)
            acc += w.to(tl.float32) * b.to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=in_row)


def moe_sum_reference(rows: torch.Tensor, topk_ids: torch.Tensor, dtype: torch.dtype, *,
                      bias: torch.Tensor | None = None,
                      topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    m, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    active = (flat >= 0)[:, None]
    kept = rows.float()
    if bias is not None:
        kept = kept + topk_weights.reshape(-1, 1).float() * bias.float()[flat.clamp(min=0)]
    kept = torch.where(active, kept, torch.zeros((), device=rows.device))
    return kept.view(m, top_k, -1).sum(dim=1).to(dtype)


def moe_sum(rows: torch.Tensor, topk_ids: torch.Tensor, dtype: torch.dtype, *,
            bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``[M, H]`` of ``dtype``: the sum of each token's active route rows of ``rows [M * top_k, H]``
    (unit stride along H; rows of inactive routes may hold anything). With ``bias [E, H]`` (the down
    GEMM's per-expert bias) each active route also adds ``topk_weights[t, j] * bias[topk_ids[t, j]]``
    (``topk_weights [M, top_k]`` then required; inactive routes' weights may hold anything)."""
    _check(rows, topk_ids, bias, topk_weights)
    m, top_k = topk_ids.shape
    h = rows.shape[1]
    out = torch.empty(m, h, dtype=dtype, device=rows.device)
    if m and h:
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        w = None if bias is None else topk_weights.reshape(-1)
        _moe_sum_kernel[(m, triton.cdiv(h, BLOCK_H))](
            rows, ids, w, bias, out, h, 0 if bias is None else bias.shape[0], rows.stride(0), out.stride(0),
            0 if w is None else w.stride(0), *((0, 0) if bias is None else bias.stride()), TOP_K=top_k,
            BLOCK=BLOCK_H, HAS_BIAS=bias is not None, num_warps=4)
    return out


def _check(rows: Any, topk_ids: Any, bias: Any, topk_weights: Any) -> None:
    for name, t in (("rows", rows), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be a 2-D int32/int64 tensor [M, top_k], got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    if rows.dim() != 2 or not rows.dtype.is_floating_point or rows.shape[0] != topk_ids.numel():
        raise ValueError(f"rows must be a 2-D float tensor [M * top_k, H] = [{topk_ids.numel()}, H], got "
                         f"{rows.dtype} {tuple(rows.shape)}")
    if rows.shape[1] > 1 and rows.stride(1) != 1:
        raise ValueError(f"rows must have unit stride along H, got strides {rows.stride()}")
    if topk_ids.device != rows.device:
        raise ValueError(f"topk_ids is on {topk_ids.device} but rows is on {rows.device}")
    if not rows.is_cuda and not interpreter_active():
        raise ValueError(f"rows is on {rows.device}: the kernel needs a CUDA tensor (or TRITON_INTERPRET=1)")
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or bias.dim() != 2 or not bias.dtype.is_floating_point \
            or bias.shape[1] != rows.shape[1]:
        raise ValueError(f"bias must be a 2-D float tensor [E, {rows.shape[1]}], got "
                         f"{getattr(bias, 'dtype', type(bias).__name__)} {tuple(getattr(bias, 'shape', ()))}")
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.dtype.is_floating_point \
            or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must be a float tensor {tuple(topk_ids.shape)} (as topk_ids) with a "
                         f"bias, got {getattr(topk_weights, 'dtype', None)} "
                         f"{tuple(getattr(topk_weights, 'shape', ()))}")
    for name, t in (("bias", bias), ("topk_weights", topk_weights)):
        if t.device != rows.device:
            raise ValueError(f"{name} is on {t.device} but rows is on {rows.device}")
