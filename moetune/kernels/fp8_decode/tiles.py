"""Tile bodies of the FP8 decode GEMMs, shared by the kernels of ``gemm`` and ``epilogue``: the W8A16 GEMV
tile on the CUDA cores (``gemv_tile``, ``gemv_tile_prefetch``) and one expert's block of routes on the
tensor cores (``block_tile``)."""

from __future__ import annotations

import triton
import triton.language as tl

from moetune.kernels.fp8_decode.split import round_e4m3


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
def gemv_tile_prefetch(a_row, w_rows, s_ptr, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
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


@triton.jit
def dot_two_terms(w, hi, lo, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr):
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
def block_tile(
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
                    acc += dot_two_terms(w, hi, lo, True, DOT_FP32) * s[:, None] * sa[None, :]
                else:
                    acc += dot_two_terms(w, hi, lo, False, DOT_FP32) * sa[:, None] * s[None, :]
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
