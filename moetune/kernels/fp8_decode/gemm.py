"""The block-FP8 GEMM of the decode path: ``out[r] = (rw[r] *) a[r // a_row_div] @ dequant(w[ids[r]]).T``.

One GEMM serves both expert GEMMs (A row = token for gate/up; A row = route for down, which applies the
routing weight). ``fp8_block_gemm`` picks the kernel from the config:

- ``ALGO "route"``: one program per (route, N tile, K split). With A_FP8 0 a GEMV on the CUDA cores
  (``_route_gemm_kernel``: broadcast multiply, row sum, no tensor cores); with A_FP8 1 or 2 a one-route
  tl.dot block (``_route_dot_kernel``).
- ``ALGO "grouped"`` (``_grouped_gemm_kernel``): routes bucketed by expert (``align_routes``) and padded
  to BLOCK_SIZE_M; one program per (M block, N tile, K split) runs tl.dot, so the routes of one expert
  share its weight reads. SWAP_AB puts the weights on the MMA's wide side.
- ``SPLIT_K``: each K split writes one fp32 partial, which the consumer (activation, top_k sum) adds:
  no zeroing launch, no atomics.
- ``A_FP8`` 1: the activations are split in-kernel into two e4m3 terms per 128-K chunk for fp8
  tensor-core dots (the weights are never converted on the CUDA cores); ``A_FP8`` 2 reads that split made
  once before the GEMM (``split_fp8_rows``), so both MMA operands come through the pipelined loads.
- ``W_TMA``: weight tiles by TMA copies; ``PREFETCH`` and ``GEMV_STAGES``: the GEMV's K-loop pipelining.

What each switch is for, and its measurements: docs/kernels/fp8_decode.md, under the switch's name.

Inactive routes (``topk_ids == -1``) cost nothing: a route program writes zeros to its output tile (or,
for the layer, whose consumers skip those rows, nothing: ``fill_inactive=False``) and returns before
reading activations, weights, scales or routing weights; the grouped path never places them in a block,
and extra programs write their zero rows. Launch shapes depend only on the shapes and
the config, never on the routing, so every launch replays from one CUDA graph while the routing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moetune.device import interpreter_active
from moetune.kernels.fp8_decode.align import align_routes
from moetune.kernels.fp8_decode.config import SCALE_BLOCK, check_gemm_config
from moetune.kernels.fp8_decode.pdl import pdl_args, pdl_enter
from moetune.kernels.fp8_decode.split import SplitRows, check_split, round_e4m3, split_fp8_rows


@triton.jit
def gemv_tile(a_row, w_rows, s_ptrs, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
               BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, ROW_SCALES: tl.constexpr,
               STAGES: tl.constexpr = 1):
    """sum over k in [k_start, k_end) of a_row[k] * w_rows[:, k] * scale, fp32 [BLOCK_SIZE_N], no tensor
    cores. ``s_ptrs`` is the tile's scale row (one pointer: the scale folds into the activation chunk) or,
    with ROW_SCALES, one pointer per row (a tile that straddles two 128-row scale blocks).

    STAGES > 1 (GEMV_STAGES) software-pipelines the K loop: Triton pipelines loads that feed no tl.dot
    only when the loop itself asks (``tl.range(num_stages=)``; the kernel's num_stages does not), and
    then stages the weight tiles through shared memory by cp.async, STAGES - 1 steps ahead."""
    sub = tl.arange(0, 128)
    # Partial sums per 16 consecutive k, which a thread holds (16-byte loads): an in-thread reduction per
    # chunk keeps the accumulator at BLOCK_SIZE_N x 8 registers' worth instead of x 128, so more
    # programs fit an SM and more weight loads are in flight.
    acc = tl.zeros([BLOCK_SIZE_N, 8], tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_SIZE_K, num_stages=STAGES):
        for j in tl.static_range(BLOCK_SIZE_K // 128):
            kb = k0 + j * 128
            offs_k = kb + sub
            k_mask = offs_k < K
            # a chunk past K has zero weights; clamping its scale index keeps the load in bounds
            kc = (tl.minimum(kb, K - 1) // 128) * stride_sk
            x = tl.load(a_row + offs_k * stride_ak, mask=k_mask, other=0.0).to(tl.float32)
            w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0)
            if ROW_SCALES:
                s = tl.load(s_ptrs + kc, mask=n_mask, other=0.0).to(tl.float32)
                prod = w.to(tl.float32) * (x[None, :] * s[:, None])
            else:
                prod = w.to(tl.float32) * (x * tl.load(s_ptrs + kc).to(tl.float32))[None, :]
            acc += tl.sum(tl.reshape(prod, (BLOCK_SIZE_N, 8, 16)), axis=2)
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_tile_prefetch(a_row, w_rows, s_ptr, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
                        BLOCK_SIZE_N: tl.constexpr):
    """``gemv_tile`` over 128-K chunks (BLOCK_SIZE_K 128, one scale pointer) with the next chunk's loads
    issued before this chunk's multiply-adds (PREFETCH): the kernel's num_stages pipelines only loads that
    feed tl.dot, so without this (or GEMV_STAGES) a GEMV program waits one memory latency per chunk. Loads
    past the split's end are masked off (no traffic)."""
    sub = tl.arange(0, 128)
    acc = tl.zeros([BLOCK_SIZE_N, 8], tl.float32)  # partial sums per 16 k, as in ``gemv_tile``
    offs_k = k_start + sub
    k_mask = offs_k < k_end
    w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    x = tl.load(a_row + offs_k * stride_ak, mask=k_mask, other=0.0)
    s = tl.load(s_ptr + (tl.minimum(k_start, K - 1) // 128) * stride_sk)
    for k0 in range(k_start, k_end, 128):
        nxt = k0 + 128
        offs_k = nxt + sub
        k_mask = offs_k < k_end
        w_next = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=n_mask[:, None] & k_mask[None, :],
                         other=0.0)
        x_next = tl.load(a_row + offs_k * stride_ak, mask=k_mask, other=0.0)
        s_next = tl.load(s_ptr + (tl.minimum(nxt, K - 1) // 128) * stride_sk)
        prod = w.to(tl.float32) * (x.to(tl.float32) * s.to(tl.float32))[None, :]
        acc += tl.sum(tl.reshape(prod, (BLOCK_SIZE_N, 8, 16)), axis=2)
        w, x, s = w_next, x_next, s_next
    return tl.sum(acc, axis=1)


# A K split reaches the kernels here and below as SPLIT_ITERS, the K blocks each split takes (computed on
# the host, never specialized): it only sets each program's K range, so every split of a tile runs one
# binary and a sweep compiles a fraction of the space (docs/kernels/fp8_decode.md, SPLIT_K). A count, not
# SPLIT_K itself: no division per program, and k_start stays a known multiple of BLOCK_SIZE_K (aligned loads).
@triton.jit(do_not_specialize=["SPLIT_ITERS"])
def _route_gemm_kernel(
    a_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr,
    N, K, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, PREFETCH: tl.constexpr, GEMV_STAGES: tl.constexpr, FILL_INACTIVE: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[split, r, n] = rw[r] * sum over the split's K range of a[r // A_ROW_DIV, k] * w[ids[r], n, k]
    * scale. A_ROW_DIV (top_k for gate/up, 1 for down) is a constexpr so that no program divides at run
    time. BLOCK_SIZE_N <= 128: the tile lies in one scale row, so the scale folds into the activation.
    PREFETCH (BLOCK_SIZE_K 128): ``_gemv_tile_prefetch``."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_ptrs = out_ptr + pid_k * stride_os + r.to(tl.int64) * stride_om + offs_n
    e = tl.load(ids_ptr + r)
    if e < 0:
        if FILL_INACTIVE:
            tl.store(out_ptrs, tl.zeros([BLOCK_SIZE_N], tl.float32), mask=n_mask)
        return
    e64 = e.to(tl.int64)
    a_row = a_ptr + (r // A_ROW_DIV).to(tl.int64) * stride_am
    w_rows = w_ptr + e64 * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    s_row = s_ptr + e64 * stride_se + ((pid_n * BLOCK_SIZE_N) // 128) * stride_sn
    k_start = pid_k * SPLIT_ITERS * BLOCK_SIZE_K
    k_end = tl.minimum(K, k_start + SPLIT_ITERS * BLOCK_SIZE_K)
    if PREFETCH:
        res = _gemv_tile_prefetch(a_row, w_rows, s_row, n_mask, k_start, k_end, K, stride_ak, stride_wk,
                                  stride_sk, BLOCK_SIZE_N)
    else:
        res = gemv_tile(a_row, w_rows, s_row, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
                         BLOCK_SIZE_N, BLOCK_SIZE_K, False, GEMV_STAGES)
    if APPLY_WEIGHT:
        res = res * tl.load(rw_ptr + r)
    tl.store(out_ptrs, res, mask=n_mask)


@triton.jit
def _dot_two_terms(w, hi, lo, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr):
    """(hi + lo / 8) times the weights on fp8 tensor cores: hi @ w, or w @ hi with SWAP_AB (hi, lo then
    K-major); in fp32 where the dot must run in fp32 (the interpreter)."""
    if DOT_FP32:
        w = w.to(tl.float32)
        hi = hi.to(tl.float32)
        lo = lo.to(tl.float32)
    if SWAP_AB:
        d = tl.dot(w, hi) + tl.dot(w, lo) * 0.125
    else:
        d = tl.dot(hi, w) + tl.dot(lo, w) * 0.125
    return d


@triton.jit
def _block_tile(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, e, rows, row_mask, n0, offs_n, n_mask, pid_k, N, K,
    A_ROW_DIV: tl.constexpr, stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, SPLIT_ITERS, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr,
    A_FP8: tl.constexpr, W_TMA: tl.constexpr,
):
    """One expert's block of routes (``rows``) x one N tile over one K split, via tl.dot: the fp8 weights
    convert exactly to the activation dtype and each 128-K partial is scaled per column. SWAP_AB computes
    the transposed tile (weights on the MMA's wide M side, the few routes on its narrow N side).

    A_FP8 instead quantizes each activation row's 128-K chunk to two e4m3 terms (hi = fp8(q), lo = fp8(8 (q -
    hi)), q = a / (amax / 448)) and runs fp8 x fp8 dots: no weight conversion on the CUDA cores, and ~1e-3
    relative activation error instead of one fp8 term's ~3e-2 (which fails the 1e-2 reference check).

    A_FP8 2 reads those terms from ``split_fp8_rows``' output instead: ``a_ptr`` is the hi term, ``lo_ptr``
    the lo term (a's strides), ``sa_ptr`` the per-chunk scales [rows, chunks]; no quantization here, the
    same dots and scaling. ``lo_ptr``, ``sa_ptr`` and their strides are unused in modes 0 and 1.

    W_TMA (A_FP8 modes only): ``w_ptr`` is a tensor descriptor of the weights [E, N, K] with block
    [1, BLOCK_SIZE_N, 128], and each weight tile arrives by one TMA copy (zeros past N and K) instead of
    per-thread loads; ``n0`` is the tile's first column."""
    e64 = e.to(tl.int64)
    a_rows = a_ptr + (rows // A_ROW_DIV).to(tl.int64) * stride_am
    if A_FP8 == 2:
        lo_rows = lo_ptr + (rows // A_ROW_DIV).to(tl.int64) * stride_am
        sa_rows = sa_ptr + (rows // A_ROW_DIV).to(tl.int64) * stride_sam
    if not W_TMA:
        w_base = w_ptr + e64 * stride_we + offs_n.to(tl.int64) * stride_wn
    s_cols = s_ptr + e64 * stride_se + (offs_n // 128) * stride_sn
    k_start = pid_k * SPLIT_ITERS * BLOCK_SIZE_K
    k_end = tl.minimum(K, k_start + SPLIT_ITERS * BLOCK_SIZE_K)
    sub = tl.arange(0, 128)
    if SWAP_AB:
        acc = tl.zeros([BLOCK_SIZE_N, BLOCK_SIZE_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_SIZE_M, BLOCK_SIZE_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_SIZE_K):
        for j in tl.static_range(BLOCK_SIZE_K // 128):
            kb = k0 + j * 128
            offs_k = kb + sub
            k_mask = offs_k < K
            # a chunk past K has zero weights; clamping its scale index keeps the load in bounds
            s = tl.load(s_cols + (tl.minimum(kb, K - 1) // 128) * stride_sk, mask=n_mask,
                        other=0.0).to(tl.float32)
            if A_FP8:
                if A_FP8 == 2:
                    # as for s: a chunk past K has zero terms, its clamped scale index stays in bounds
                    sa = tl.load(sa_rows + (tl.minimum(kb, K - 1) // 128) * stride_sac, mask=row_mask,
                                 other=0.0)
                    if SWAP_AB:  # the terms K-major, as the MMA's right operand
                        hi_mask = k_mask[:, None] & row_mask[None, :]
                        hi = tl.load(a_rows[None, :] + offs_k[:, None] * stride_ak, mask=hi_mask, other=0.0)
                        lo = tl.load(lo_rows[None, :] + offs_k[:, None] * stride_ak, mask=hi_mask, other=0.0)
                    else:
                        hi_mask = row_mask[:, None] & k_mask[None, :]
                        hi = tl.load(a_rows[:, None] + offs_k[None, :] * stride_ak, mask=hi_mask, other=0.0)
                        lo = tl.load(lo_rows[:, None] + offs_k[None, :] * stride_ak, mask=hi_mask, other=0.0)
                else:
                    a = tl.load(a_rows[:, None] + offs_k[None, :] * stride_ak,
                                mask=row_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
                    sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-30) * (1.0 / 448.0)
                    q = a / sa[:, None]
                    hi_f = round_e4m3(q)
                    hi = hi_f.to(tl.float8e4nv)
                    lo = round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv)
                    if SWAP_AB:
                        hi = tl.trans(hi)
                        lo = tl.trans(lo)
                if W_TMA:
                    w = w_ptr.load([e, n0, kb]).reshape(BLOCK_SIZE_N, 128)
                    if not SWAP_AB:
                        w = tl.trans(w)
                elif SWAP_AB:
                    w = tl.load(w_base[:, None] + offs_k[None, :] * stride_wk,
                                mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                else:
                    w = tl.load(w_base[None, :] + offs_k[:, None] * stride_wk,
                                mask=k_mask[:, None] & n_mask[None, :], other=0.0)
                if SWAP_AB:
                    acc += _dot_two_terms(w, hi, lo, True, DOT_FP32) * s[:, None] * sa[None, :]
                else:
                    acc += _dot_two_terms(w, hi, lo, False, DOT_FP32) * sa[:, None] * s[None, :]
            elif SWAP_AB:
                a = tl.load(a_rows[None, :] + offs_k[:, None] * stride_ak,
                            mask=k_mask[:, None] & row_mask[None, :], other=0.0)
                w = tl.load(w_base[:, None] + offs_k[None, :] * stride_wk,
                            mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                if DOT_FP32:
                    acc += tl.dot(w.to(tl.float32), a.to(tl.float32)) * s[:, None]
                else:
                    acc += tl.dot(w.to(a.dtype), a) * s[:, None]
            else:
                a = tl.load(a_rows[:, None] + offs_k[None, :] * stride_ak,
                            mask=row_mask[:, None] & k_mask[None, :], other=0.0)
                w = tl.load(w_base[None, :] + offs_k[:, None] * stride_wk,
                            mask=k_mask[:, None] & n_mask[None, :], other=0.0)
                if DOT_FP32:
                    acc += tl.dot(a.to(tl.float32), w.to(tl.float32)) * s[None, :]
                else:
                    acc += tl.dot(a, w.to(a.dtype)) * s[None, :]
    if SWAP_AB:
        if APPLY_WEIGHT:
            acc = acc * tl.load(rw_ptr + rows, mask=row_mask, other=0.0)[None, :]
        tl.store(out_ptr + rows[None, :].to(tl.int64) * stride_om + offs_n[:, None], acc,
                 mask=n_mask[:, None] & row_mask[None, :])
    else:
        if APPLY_WEIGHT:
            acc = acc * tl.load(rw_ptr + rows, mask=row_mask, other=0.0)[:, None]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :], acc,
                 mask=row_mask[:, None] & n_mask[None, :])


@triton.jit
def _zero_inactive_rows(ids_ptr, out_ptr, block, R, offs_n, n_mask, stride_om,
                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Zeros in this N tile of the inactive routes among rows [block * BLOCK_SIZE_M, +BLOCK_SIZE_M)."""
    rows = block * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    ids = tl.load(ids_ptr + rows, mask=rows < R, other=0)
    zero = tl.zeros([BLOCK_SIZE_M, BLOCK_SIZE_N], tl.float32)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :], zero,
             mask=(ids < 0)[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["NUM_BLOCKS", "SPLIT_ITERS"])  # NUM_BLOCKS moves with E and the routes
def _grouped_gemm_kernel(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, ids_ptr, sorted_ptr, block_expert_ptr, rw_ptr, out_ptr,
    N, K, R, NUM_BLOCKS, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, SPLIT_ITERS, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr,
    A_FP8: tl.constexpr, W_TMA: tl.constexpr, FILL_INACTIVE: tl.constexpr, PDL: tl.constexpr,
):
    """Expert-grouped product: program (m, n tile, K split) takes M block m of ``align_routes``' sorted
    route ids (NUM_BLOCKS blocks); blocks past the used ones exit at once, and programs past NUM_BLOCKS
    write the zero rows of inactive routes. ``lo_ptr``, ``sa_ptr``: as ``_block_tile`` (A_FP8 2 only)."""
    pdl_enter(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_split = out_ptr + pid_k * stride_os
    if FILL_INACTIVE and pid_m >= NUM_BLOCKS:
        _zero_inactive_rows(ids_ptr, out_split, pid_m - NUM_BLOCKS, R, offs_n, n_mask, stride_om,
                            BLOCK_SIZE_M, BLOCK_SIZE_N)
        return
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:  # beyond the blocks this routing uses
        return
    rows = tl.load(sorted_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    _block_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_split, e, rows, rows < R,
                pid_n * BLOCK_SIZE_N, offs_n, n_mask, pid_k, N, K, A_ROW_DIV, stride_am, stride_ak,
                stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                stride_om, APPLY_WEIGHT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, SWAP_AB,
                DOT_FP32, A_FP8, W_TMA)


@triton.jit(do_not_specialize=["SPLIT_ITERS"])
def _route_dot_kernel(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr, N, K, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, DOT_FP32: tl.constexpr, A_FP8: tl.constexpr, W_TMA: tl.constexpr,
    FILL_INACTIVE: tl.constexpr, PDL: tl.constexpr,
):
    """The route grid on tensor cores (A_FP8 1 or 2): program (route, N tile, K split) runs ``_block_tile``
    with its one route in column 0 of a 16-wide block (the other columns masked off: MMA work is free at
    decode, and no fp8 weight is converted on the CUDA cores)."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_split = out_ptr + pid_k * stride_os
    e = tl.load(ids_ptr + r)
    if e < 0:
        if FILL_INACTIVE:
            tl.store(out_split + r.to(tl.int64) * stride_om + offs_n, tl.zeros([BLOCK_SIZE_N], tl.float32),
                     mask=n_mask)
        return
    lanes = tl.arange(0, 16)
    _block_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_split, e, r + lanes * 0, lanes == 0,
                pid_n * BLOCK_SIZE_N, offs_n, n_mask, pid_k, N, K, A_ROW_DIV, stride_am, stride_ak,
                stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                stride_om, APPLY_WEIGHT, 16, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, True, DOT_FP32, A_FP8,
                W_TMA)


def _weight_descriptor(w: torch.Tensor, block_n: int) -> TensorDescriptor:
    """W_TMA's descriptor of the expert weights [E, N, K], one [1, block_n, 128] tile per copy; ValueError
    where TMA cannot address them (it needs unit stride along K, 16-byte aligned strides and base)."""
    if w.stride(2) != 1 or any(st % 16 for st in w.stride()[:2]) or w.data_ptr() % 16:
        raise ValueError(f"config['W_TMA'] 1 needs weights with unit stride along K and 16-byte aligned "
                         f"strides and base, got strides {w.stride()}")
    return TensorDescriptor(w, list(w.shape), list(w.stride()), [1, block_n, SCALE_BLOCK])


def fp8_block_gemm(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, topk_ids: torch.Tensor,
                   out: torch.Tensor, config: Mapping[str, Any], *, a_row_div: int = 1,
                   topk_weights: torch.Tensor | None = None,
                   aligned: tuple[torch.Tensor, torch.Tensor] | None = None,
                   a_split: SplitRows | None = None, pdl: bool = False,
                   fill_inactive: bool = True) -> torch.Tensor:
    """``out[r, :] = (topk_weights[r] *) a[r // a_row_div] @ dequant(w[topk_ids[r]]).T`` for every route r.

    Inputs are assumed checked (``fp8_decode_moe`` or the spec does that). ``out`` is fp32, either
    [SPLIT_K, R, N] (one partial sum per K split, left for the consumer to add: no atomics, no zeroing)
    or [R, N] (the partials are then added here). ``aligned`` is ``align_routes``' result for the
    grouped algorithm (computed here when None). Rows of inactive routes are zero.

    A_FP8 2 runs ``split_fp8_rows(a)`` first (one launch more), unless ``a_split`` gives that split of
    ``a`` (checked: shapes, dtypes; ValueError naming it); ``a_split`` with another A_FP8 is a ValueError.
    ``pdl``: every launch here uses programmatic dependent launch (``pdl_enter``).
    ``fill_inactive=False`` leaves the rows of inactive routes undefined, for consumers that skip them
    (the layer's): an all-inactive launch then writes nothing, and the grouped grid has no zeroing
    programs."""
    cfg = check_gemm_config(config)
    if a_split is not None:
        if cfg["A_FP8"] != 2:
            raise ValueError(f"a_split is only used with A_FP8 2, got A_FP8 {cfg['A_FP8']}")
        a_split = check_split(a_split, a.shape[0], a.shape[1], a.device, "a_split")
    split = cfg["SPLIT_K"]
    if out.dim() == 2 and split > 1:
        partials = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
        fp8_block_gemm(a, w, w_scale, topk_ids, partials, cfg, a_row_div=a_row_div,
                       topk_weights=topk_weights, aligned=aligned, a_split=a_split, pdl=pdl,
                       fill_inactive=fill_inactive)
        return torch.sum(partials, dim=0, out=out)
    parts = out if out.dim() == 3 else out.unsqueeze(0)
    if parts.shape[0] != split or parts.stride(2) != 1:
        raise ValueError(f"out must be [{split}, R, N] with unit stride along N for SPLIT_K {split}, "
                         f"got shape {tuple(out.shape)} strides {out.stride()}")
    ids = topk_ids.reshape(-1)
    rw = topk_weights.reshape(-1) if topk_weights is not None else ids
    routes, n = parts.shape[1:]
    k = w.shape[2]
    if routes == 0:
        return out
    iters = triton.cdiv(triton.cdiv(k, cfg["BLOCK_SIZE_K"]), split)  # K blocks per split
    common = dict(APPLY_WEIGHT=topk_weights is not None, BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"],
                  BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], SPLIT_ITERS=iters,
                  FILL_INACTIVE=fill_inactive, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  **pdl_args(pdl))
    w_strides = (*w.stride(), *w_scale.stride(), parts.stride(0), parts.stride(1))
    n_tiles = triton.cdiv(n, cfg["BLOCK_SIZE_N"])
    a_mode = cfg["A_FP8"]
    w_arg = _weight_descriptor(w, cfg["BLOCK_SIZE_N"]) if cfg["W_TMA"] else w
    if a_mode == 2:  # the tl.dot kernels read the hi term as their A operand, lo and sa beside it
        hi, lo, sa = a_split if a_split is not None else split_fp8_rows(a, pdl=pdl)
        a_args = (hi, lo, sa)
        a_strides = (hi.stride(0), hi.stride(1), sa.stride(0), sa.stride(1))
        # fp8 dots on the GPU whatever a's dtype; the interpreter's fp8 tl.dot is wrong (3.9): fp32 there
        dot_fp32 = interpreter_active()
    else:  # lo, sa and their strides unused
        a_args = (a, a, a)
        a_strides = (a.stride(0), a.stride(1), 0, 0)
        # the Triton interpreter's bf16 (and fp8) tl.dot is wrong or missing (3.9); it runs the dot in fp32
        dot_fp32 = a.dtype == torch.float32 or (interpreter_active()
                                                and (a_mode == 1 or a.dtype == torch.bfloat16))
    if cfg["ALGO"] == "route":
        if a_mode:
            _route_dot_kernel[(routes, n_tiles, split)](
                *a_args, w_arg, w_scale, ids, rw, parts, n, k, a_row_div, *a_strides, *w_strides,
                DOT_FP32=dot_fp32, A_FP8=a_mode, W_TMA=bool(cfg["W_TMA"]), **common)
        else:
            _route_gemm_kernel[(routes, n_tiles, split)](
                a, w, w_scale, ids, rw, parts, n, k, a_row_div, a.stride(0), a.stride(1), *w_strides,
                PREFETCH=bool(cfg["PREFETCH"]), GEMV_STAGES=cfg["GEMV_STAGES"], **common)
        return out
    if aligned is None:
        aligned = align_routes(ids, w.shape[0], cfg["BLOCK_SIZE_M"], pdl=pdl)
    sorted_ids, block_expert = aligned
    nb = block_expert.numel()
    zero_programs = triton.cdiv(routes, cfg["BLOCK_SIZE_M"]) if fill_inactive else 0
    _grouped_gemm_kernel[(nb + zero_programs, n_tiles, split)](
        *a_args, w_arg, w_scale, ids, sorted_ids, block_expert, rw, parts, n, k, routes, nb, a_row_div,
        *a_strides, *w_strides, BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], SWAP_AB=bool(cfg["SWAP_AB"]),
        DOT_FP32=dot_fp32, A_FP8=a_mode, W_TMA=bool(cfg["W_TMA"]), **common)
    return out
