"""The decode path's kernels around the GEMMs: the gated activation after gate/up, the top_k sum after
down, and their FUSE forms, each fused into the GEMV before it (one launch, one graph node and one fp32
buffer round trip less; see docs/kernels/fp8_decode.md, FUSE).

Activations follow ``moetune.kernels.activations`` (0 silu, 1 gelu_tanh, 2 swiglu, in fp32). Every kernel
treats inactive routes (id -1) as zero without reading their rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from moetune.kernels.activations import ACTIVATIONS
from moetune.kernels.fp8_decode.config import SCALE_BLOCK, check_gemm_config
from moetune.kernels.fp8_decode.pdl import pdl_args, pdl_enter
from moetune.kernels.fp8_decode.split import SplitRows, check_split, round_e4m3
from moetune.kernels.fp8_decode.tiles import gemv_tile

_ACT_CODE = {name: i for i, name in enumerate(ACTIVATIONS)}


@triton.jit
def _gate_act(g, u, limit, ACTIVATION: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """act(gate, up) in fp32, formulas as moetune.kernels.activations (0 silu, 1 gelu_tanh, 2 swiglu)."""
    if HAS_LIMIT and ACTIVATION != 1:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    if ACTIVATION == 0:
        y = g * tl.sigmoid(g) * u
    elif ACTIVATION == 1:
        # 0.5 * (1 + tanh(z)) == sigmoid(2 z), z = sqrt(2 / pi) * (g + 0.044715 g^3)
        y = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g)) * u
    else:
        y = g * tl.sigmoid(1.702 * g) * (u + 1.0)  # alpha = moetune.kernels.activations.SWIGLU_ALPHA
    return y


@triton.jit
def _gated_act_kernel(
    gu_ptr, out_ptr, ids_ptr, hi_ptr, lo_ptr, sa_ptr, I, CHUNKS_TOTAL, stride_gs, stride_gm, stride_om,
    stride_hm, stride_sam, limit,
    SPLITS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_LIMIT: tl.constexpr, BLOCK: tl.constexpr,
    SPLIT_OUT: tl.constexpr, FILL_INACTIVE: tl.constexpr, PDL: tl.constexpr,
):
    """out[r] = act(gate, up), gate/up = the sum of the gate/up GEMM's SPLITS partials [.., :I] / [.., I:];
    inactive routes get zeros (nothing without FILL_INACTIVE), unread. Formulas as in
    moetune.kernels.activations (0 silu, 1 gelu_tanh, 2 swiglu).

    SPLIT_OUT also writes A_FP8 2's split of ``out`` (``split._split_rows_kernel``'s terms of the values as
    stored, to the bit) into hi, lo [R, I] and sa [R, chunks]: the down GEMM's input without a launch
    of its own. BLOCK is a multiple of 128 or covers all of I."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    out_ptrs = out_ptr + r.to(tl.int64) * stride_om + offs
    e = tl.load(ids_ptr + r)
    if not FILL_INACTIVE:
        if e < 0:
            return
    if e < 0:
        v = tl.zeros([BLOCK], tl.float32)
    else:
        row = gu_ptr + r.to(tl.int64) * stride_gm
        g = tl.zeros([BLOCK], tl.float32)
        u = tl.zeros([BLOCK], tl.float32)
        for sp in tl.static_range(SPLITS):
            g += tl.load(row + sp * stride_gs + offs, mask=mask, other=0.0).to(tl.float32)
            u += tl.load(row + sp * stride_gs + I + offs, mask=mask, other=0.0).to(tl.float32)
        v = _gate_act(g, u, limit, ACTIVATION, HAS_LIMIT)
    v = v.to(out_ptr.dtype.element_ty)
    tl.store(out_ptrs, v, mask=mask)
    if SPLIT_OUT:
        CH: tl.constexpr = 128 if BLOCK >= 128 else BLOCK
        a = tl.reshape(tl.where(mask, v.to(tl.float32), 0.0), [BLOCK // CH, CH])
        sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-30) * (1.0 / 448.0)
        q = a / sa[:, None]
        hi_f = round_e4m3(q)
        term = r.to(tl.int64) * stride_hm + tl.reshape(offs, [BLOCK // CH, CH])
        term_mask = tl.reshape(mask, [BLOCK // CH, CH])
        tl.store(hi_ptr + term, hi_f.to(tl.float8e4nv), mask=term_mask)
        tl.store(lo_ptr + term, round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv), mask=term_mask)
        chunks = tl.program_id(1) * (BLOCK // CH) + tl.arange(0, BLOCK // CH)
        tl.store(sa_ptr + r.to(tl.int64) * stride_sam + chunks, sa, mask=chunks < CHUNKS_TOTAL)


@triton.jit
def _sum_topk_kernel(y_ptr, ids_ptr, out_ptr, H, TOP_K, stride_ys, stride_ym, stride_om,
                     SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[m] = sum over active routes r of token m and over the down GEMM's SPLITS partials of y[split, r]
    (fp32), cast to out's dtype."""
    pdl_enter(PDL)
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in range(TOP_K):
        r = m * TOP_K + j
        if tl.load(ids_ptr + r) >= 0:
            for sp in tl.static_range(SPLITS):
                acc += tl.load(y_ptr + sp * stride_ys + r.to(tl.int64) * stride_ym + offs, mask=mask,
                               other=0.0)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_gate_up_act_kernel(
    x_ptr, w_ptr, s_ptr, ids_ptr, out_ptr, I, K, A_ROW_DIV, limit,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_om,
    ACTIVATION: tl.constexpr, HAS_LIMIT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, UP_ROW_SCALES: tl.constexpr, PDL: tl.constexpr,
):
    """gate/up GEMV and the activation in one launch (FUSE, SPLIT_K 1): program (route, I tile) computes
    the gate rows [n, n + BN) and the up rows [I + n, ..) of its expert and writes act(gate, up) in out's
    dtype; no fp32 gate/up buffer, one graph node less. UP_ROW_SCALES: I % BN != 0, so an up tile may
    straddle two scale blocks."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < I
    out_ptrs = out_ptr + r.to(tl.int64) * stride_om + offs_n
    e = tl.load(ids_ptr + r)
    if e < 0:
        tl.store(out_ptrs, tl.zeros([BLOCK_SIZE_N], tl.float32).to(out_ptr.dtype.element_ty), mask=n_mask)
        return
    e64 = e.to(tl.int64)
    a_row = x_ptr + (r // A_ROW_DIV).to(tl.int64) * stride_am
    w_e = w_ptr + e64 * stride_we
    s_e = s_ptr + e64 * stride_se
    g = gemv_tile(a_row, w_e + offs_n[:, None].to(tl.int64) * stride_wn,
                   s_e + ((pid_n * BLOCK_SIZE_N) // 128) * stride_sn, n_mask, 0, K, K, stride_ak, stride_wk,
                   stride_sk, BLOCK_SIZE_N, BLOCK_SIZE_K, False)
    up = I + offs_n
    if UP_ROW_SCALES:
        s_up = s_e + (up // 128) * stride_sn
    else:
        s_up = s_e + ((I + pid_n * BLOCK_SIZE_N) // 128) * stride_sn
    u = gemv_tile(a_row, w_e + up[:, None].to(tl.int64) * stride_wn, s_up, n_mask, 0, K, K, stride_ak,
                   stride_wk, stride_sk, BLOCK_SIZE_N, BLOCK_SIZE_K, UP_ROW_SCALES)
    tl.store(out_ptrs, _gate_act(g, u, limit, ACTIVATION, HAS_LIMIT).to(out_ptr.dtype.element_ty),
             mask=n_mask)


@triton.jit
def _fused_down_sum_kernel(
    a_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr, N, K, TOP_K,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_om,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, PDL: tl.constexpr,
):
    """Down GEMV, routing weight and top_k sum in one launch (FUSE, SPLIT_K 1): program (token, N tile)
    owns its output tile and adds its active routes' rows in registers (no atomics, no per-route buffer,
    one graph node less); inactive routes are skipped before any read."""
    pdl_enter(PDL)
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    s_off = ((pid_n * BLOCK_SIZE_N) // 128) * stride_sn
    acc = tl.zeros([BLOCK_SIZE_N], tl.float32)
    for j in range(TOP_K):
        r = m * TOP_K + j
        e = tl.load(ids_ptr + r)
        if e >= 0:
            e64 = e.to(tl.int64)
            y = gemv_tile(a_ptr + r.to(tl.int64) * stride_am,
                           w_ptr + e64 * stride_we + offs_n[:, None].to(tl.int64) * stride_wn,
                           s_ptr + e64 * stride_se + s_off, n_mask, 0, K, K, stride_ak, stride_wk, stride_sk,
                           BLOCK_SIZE_N, BLOCK_SIZE_K, False)
            acc += y * tl.load(rw_ptr + r)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def fused_gate_up_act(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, topk_ids: torch.Tensor,
                      out: torch.Tensor, config: Mapping[str, Any], activation: str,
                      limit: float | None = None, pdl: bool = False) -> torch.Tensor:
    """``out [R, I] = act(x[r // top_k] @ dequant(w13[ids[r]]).T)`` in one launch (a FUSE config);
    zeros for inactive routes."""
    cfg = check_gemm_config(config)
    routes, inter = out.shape
    ids = topk_ids.reshape(-1)
    if routes:
        bn = cfg["BLOCK_SIZE_N"]
        _fused_gate_up_act_kernel[(routes, triton.cdiv(inter, bn))](
            x, w13, w13_scale, ids, out, inter, w13.shape[2], routes // x.shape[0],
            float(limit) if limit is not None else 0.0, x.stride(0), x.stride(1), *w13.stride(),
            *w13_scale.stride(), out.stride(0), ACTIVATION=_ACT_CODE[activation], HAS_LIMIT=limit is not None,
            BLOCK_SIZE_N=bn, BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], UP_ROW_SCALES=inter % bn != 0,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_args(pdl))
    return out


def fused_down_sum(act: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, topk_ids: torch.Tensor,
                   topk_weights: torch.Tensor, out: torch.Tensor, config: Mapping[str, Any],
                   pdl: bool = False) -> torch.Tensor:
    """``out [M, H] = sum_j rw[m, j] * act[m * top_k + j] @ dequant(w2[ids[m, j]]).T`` over active routes,
    in one launch (a FUSE config), cast to out's dtype."""
    cfg = check_gemm_config(config)
    m, h = out.shape
    if m:
        bn = cfg["BLOCK_SIZE_N"]
        _fused_down_sum_kernel[(m, triton.cdiv(h, bn))](
            act, w2, w2_scale, topk_ids.reshape(-1), topk_weights.reshape(-1), out, h, w2.shape[2],
            act.shape[0] // m, act.stride(0), act.stride(1), *w2.stride(), *w2_scale.stride(), out.stride(0),
            BLOCK_SIZE_N=bn, BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **pdl_args(pdl))
    return out


def gated_activation_rows(gu: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, activation: str,
                          limit: float | None = None, pdl: bool = False,
                          split: SplitRows | None = None, fill_inactive: bool = True) -> torch.Tensor:
    """``out [R, I] = act(gate, up)`` per active route, zeros for inactive ones (with
    ``fill_inactive=False`` their rows are left as they are: the down GEMM never reads them); ``gu`` is
    the gate/up output, [R, 2I] or [splits, R, 2I] partial sums. ``split`` (hi, lo, sa, checked as
    ``split_fp8_rows``' ``out``) also receives ``split_fp8_rows(out)``, bit for bit, in the same launch."""
    routes, inter = out.shape
    parts = gu if gu.dim() == 3 else gu.unsqueeze(0)
    if split is not None:
        if out.stride(1) != 1:
            raise ValueError(f"split needs out with unit stride along I, got strides {out.stride()}")
        hi, lo, sa = check_split(split, routes, inter, out.device, "split")
        if hi.stride(1) != 1 or sa.stride(1) != 1:
            raise ValueError(f"split: hi and sa need unit stride along their last dim, got {hi.stride()}, "
                             f"{sa.stride()}")
    else:
        hi = lo = sa = out  # unused
    if routes:
        block = min(1024, triton.next_power_of_2(inter))
        _gated_act_kernel[(routes, triton.cdiv(inter, block))](
            parts, out, topk_ids.reshape(-1), hi, lo, sa, inter, triton.cdiv(inter, SCALE_BLOCK),
            parts.stride(0), parts.stride(1), out.stride(0), hi.stride(0), sa.stride(0),
            float(limit) if limit is not None else 0.0, SPLITS=parts.shape[0],
            ACTIVATION=_ACT_CODE[activation], HAS_LIMIT=limit is not None, BLOCK=block,
            SPLIT_OUT=split is not None, FILL_INACTIVE=fill_inactive, num_warps=4, **pdl_args(pdl))
    return out


def sum_topk(y: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """``out [M, H] = sum_j y[m * top_k + j]`` over active routes; ``y`` is [R, H] or [splits, R, H]."""
    m, h = out.shape
    parts = y if y.dim() == 3 else y.unsqueeze(0)
    if m:
        top_k = parts.shape[1] // m
        block = min(1024, triton.next_power_of_2(h))
        _sum_topk_kernel[(m, triton.cdiv(h, block))](
            parts, topk_ids.reshape(-1), out, h, top_k, parts.stride(0), parts.stride(1), out.stride(0),
            SPLITS=parts.shape[0], BLOCK=block, num_warps=4, **pdl_args(pdl))
    return out
