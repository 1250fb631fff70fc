"""FP8 block-scale (W8A16) MoE decode path: gate/up GEMM -> gated activation -> down GEMM -> sum over top_k.

Weights are float8_e4m3fn with one scale per 128x128 block (``moetune.quant.fp8_block``).
One block-FP8 GEMM serves both expert GEMMs (A row = token for gate/up, A row = route
for down, where the routing weight is applied), in two algorithms (config key ALGO) the
tuner picks per route density:

- ``"route"``: one program per (route, N tile, K split). A GEMV: broadcast-multiply and a
  final row sum, no tensor cores. Split-K writes one fp32 partial per K split, which the
  consumer (activation, top_k sum) adds: at one token enough programs, and loads, are in
  flight to approach copy bandwidth, with no zeroing launch and no atomics.
- ``"grouped"``: routes bucketed by expert on the GPU (``_align_kernel``: fixed-size buffers
  sized from the route count and E, so no host sync and CUDA-graph capturable), padded to
  BLOCK_SIZE_M; one program per (M block, N tile, K split) runs ``tl.dot``, so routes
  sharing an expert share its weight reads. Unused M blocks exit at once; a few extra
  programs write the zero rows of inactive routes. SWAP_AB puts the weights on the MMA's
  wide side (measured on the H200: a tie).

Two switches, also config keys: ``A_FP8`` 1 runs either algorithm on fp8 tensor cores with the
activations split in-kernel into two e4m3 terms per 128-K chunk (the weights are never converted
on the CUDA cores; with A_FP8 "route" is a one-route tl.dot block). ``FUSE`` (route, SPLIT_K 1, a
layer option) fuses the activation into the gate/up GEMM or the top_k sum into the down GEMM,
each one launch, one graph node and one fp32 buffer round trip less.

``A_FP8`` 2 splits the activations once, before the GEMM (``split_fp8_rows``: the same two terms and
per-row, per-128-chunk scales, written to global memory), instead of in every program (every N tile and
K split) as A_FP8 1 does. Both MMA operands then come straight from global memory through the pipelined
(num_stages) loads, with no register -> MMA-layout move of computed terms, as in vLLM's w8a8 block-fp8
fused_moe kernel (measured ~35% faster than ours at 16-64 tokens on the H200). The cost: one extra
launch and a 2 x [rows, K] fp8 round trip, which ``fp8_block_gemm`` includes unless given ``a_split``.
In the layer the gated activation writes the down GEMM's split itself (``gated_activation_rows(split=)``),
so only gate/up's split of x is a launch of its own.

Inactive routes (``topk_ids == -1``, computed elsewhere, e.g. on the CPU) cost nothing: a
route program writes zeros to its output tile and returns before reading activations,
weights, scales or routing weights; the tl.dot paths never place them in a block. The
activation and the top_k sum treat them as zero without reading their rows. Launch shapes
depend only on M, top_k, N and the config, so the whole path replays from one CUDA graph
while the routing changes. Intermediates (the gate/up output, per-route down output) are fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from moetune.device import interpreter_active
from moetune.kernels.activations import ACTIVATIONS, gated_activation
from moetune.kernels.fp8_decode.config import (
    GEMMS,
    SCALE_BLOCK,
    check_gemm_config,
    gemm_shapes,
)
from moetune.quant.fp8_block import FP8_DTYPE, dequantize_fp8_block

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ACT_CODE = {name: i for i, name in enumerate(ACTIVATIONS)}


# ---- kernels ------------------------------------------------------------------------------------
@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+, a launch with ``launch_pdl``): wait until the previous
    kernel's writes are visible, then let the next kernel's programs launch and wait the same way, so
    launches overlap the kernel before instead of following its last program. Nothing without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _gemv_tile(a_row, w_rows, s_ptrs, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
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
    """``_gemv_tile`` over 128-K chunks (BLOCK_SIZE_K 128, one scale pointer) with the next chunk's loads
    issued before this chunk's multiply-adds (PREFETCH): the kernel's num_stages pipelines only loads that
    feed tl.dot, so without this (or GEMV_STAGES) a GEMV program waits one memory latency per chunk. Loads
    past the split's end are masked off (no traffic)."""
    sub = tl.arange(0, 128)
    acc = tl.zeros([BLOCK_SIZE_N, 8], tl.float32)  # partial sums per 16 k, as in ``_gemv_tile``
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
# the host, never specialized): it only sets each program's K range, so every split runs one binary and a
# sweep compiles a fifth of the fp8 space (DeepSeek-V3 TP8 gate/up: 24162 -> 5094 binaries). A count, not
# SPLIT_K itself: no division per program, and k_start stays a known multiple of BLOCK_SIZE_K (aligned loads).
@triton.jit(do_not_specialize=["SPLIT_ITERS"])
def _route_gemm_kernel(
    a_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr,
    N, K, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, PREFETCH: tl.constexpr, GEMV_STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """out[split, r, n] = rw[r] * sum over the split's K range of a[r // A_ROW_DIV, k] * w[ids[r], n, k]
    * scale. A_ROW_DIV (top_k for gate/up, 1 for down) is a constexpr so that no program divides at run
    time. BLOCK_SIZE_N <= 128: the tile lies in one scale row, so the scale folds into the activation.
    PREFETCH (BLOCK_SIZE_K 128): ``_gemv_tile_prefetch``."""
    _pdl_enter(PDL)
    r = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_ptrs = out_ptr + pid_k * stride_os + r.to(tl.int64) * stride_om + offs_n
    e = tl.load(ids_ptr + r)
    if e < 0:
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
        res = _gemv_tile(a_row, w_rows, s_row, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
                         BLOCK_SIZE_N, BLOCK_SIZE_K, False, GEMV_STAGES)
    if APPLY_WEIGHT:
        res = res * tl.load(rw_ptr + r)
    tl.store(out_ptrs, res, mask=n_mask)


@triton.jit
def _round_e4m3(v):
    """fp32 ``v`` rounded (half away from zero) to e4m3's 3 mantissa bits by integer ops, so the fp8 cast
    after it is exact: the Triton interpreter's own fp32 -> e4m3 cast drops the carry of a rounding into
    the next binade (126.4 -> 64)."""
    bits = v.to(tl.int32, bitcast=True)
    return ((bits + 0x80000) & -0x100000).to(tl.float32, bitcast=True)


@triton.jit
def _split_rows_kernel(
    a_ptr, hi_ptr, lo_ptr, sa_ptr, K, CHUNKS_TOTAL, stride_am, stride_ak, stride_hm, stride_hk,
    stride_sam, stride_sac, CHUNKS: tl.constexpr, PDL: tl.constexpr,
):
    """A_FP8 2's activation split, once per GEMM: program (row, chunk group) writes CHUNKS 128-K chunks of
    row ``a[row]`` as hi = fp8(q), lo = fp8(8 (q - hi)), q = a / sa, sa = amax / 448 (A_FP8 1's terms, to
    the bit); hi and lo share strides. Elements past K are not written; a chunk's scale covers its part
    below K."""
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.program_id(1) * CHUNKS + tl.arange(0, CHUNKS)
    offs_k = chunks[:, None] * 128 + tl.arange(0, 128)[None, :]
    mask = offs_k < K
    a = tl.load(a_ptr + row * stride_am + offs_k * stride_ak, mask=mask, other=0.0).to(tl.float32)
    sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-30) * (1.0 / 448.0)
    q = a / sa[:, None]
    hi_f = _round_e4m3(q)
    term = row * stride_hm + offs_k * stride_hk
    tl.store(hi_ptr + term, hi_f.to(tl.float8e4nv), mask=mask)
    tl.store(lo_ptr + term, _round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv), mask=mask)
    tl.store(sa_ptr + row * stride_sam + chunks * stride_sac, sa, mask=chunks < CHUNKS_TOTAL)


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
                    hi_f = _round_e4m3(q)
                    hi = hi_f.to(tl.float8e4nv)
                    lo = _round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv)
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
    A_FP8: tl.constexpr, W_TMA: tl.constexpr, PDL: tl.constexpr,
):
    """Expert-grouped product: program (m, n tile, K split) takes M block m of ``align_routes``' sorted
    route ids (NUM_BLOCKS blocks); blocks past the used ones exit at once, and programs past NUM_BLOCKS
    write the zero rows of inactive routes. ``lo_ptr``, ``sa_ptr``: as ``_block_tile`` (A_FP8 2 only)."""
    _pdl_enter(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_split = out_ptr + pid_k * stride_os
    if pid_m >= NUM_BLOCKS:
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
    SPLIT_ITERS, DOT_FP32: tl.constexpr, A_FP8: tl.constexpr, W_TMA: tl.constexpr, PDL: tl.constexpr,
):
    """The route grid on tensor cores (A_FP8 1 or 2): program (route, N tile, K split) runs ``_block_tile``
    with its one route in column 0 of a 16-wide block (the other columns masked off: MMA work is free at
    decode, and no fp8 weight is converted on the CUDA cores)."""
    _pdl_enter(PDL)
    r = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    out_split = out_ptr + pid_k * stride_os
    e = tl.load(ids_ptr + r)
    if e < 0:
        tl.store(out_split + r.to(tl.int64) * stride_om + offs_n, tl.zeros([BLOCK_SIZE_N], tl.float32),
                 mask=n_mask)
        return
    lanes = tl.arange(0, 16)
    _block_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_split, e, r + lanes * 0, lanes == 0,
                pid_n * BLOCK_SIZE_N, offs_n, n_mask, pid_k, N, K, A_ROW_DIV, stride_am, stride_ak,
                stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                stride_om, APPLY_WEIGHT, 16, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, True, DOT_FP32, A_FP8,
                W_TMA)


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, R, MAX_BLOCKS, E,
    BLOCK_SIZE_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: bucket the active routes by expert, each bucket padded to BLOCK_SIZE_M.

    Writes block_expert[b] (expert of M block b, -1 past the used blocks) and sorted[b * BLOCK_SIZE_M + i]
    (route ids, R for padding). Counts and ranks come from one-hot sums, so the result is deterministic."""
    _pdl_enter(PDL)
    experts = tl.arange(0, E_P2)
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([E_P2], tl.int32)
    for c0 in range(0, R, CHUNK):
        ids = tl.load(ids_ptr + c0 + lane, mask=c0 + lane < R, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    nblk = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    ends = tl.cumsum(nblk, 0)
    cursor = (ends - nblk) * BLOCK_SIZE_M
    for b0 in range(0, MAX_BLOCKS, CHUNK):
        b = b0 + lane
        owner = tl.sum((ends[None, :] <= b[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < E, owner, -1), mask=b < MAX_BLOCKS)
    pad = tl.zeros([FILL], tl.int32) + R
    for i0 in range(0, MAX_BLOCKS * BLOCK_SIZE_M, FILL):
        i = i0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + i, pad, mask=i < MAX_BLOCKS * BLOCK_SIZE_M)
    tl.debug_barrier()
    for c0 in range(0, R, CHUNK):
        ids = tl.load(ids_ptr + c0 + lane, mask=c0 + lane < R, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        base = tl.sum(onehot * cursor[None, :], axis=1)
        earlier = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])
        rank = tl.sum(earlier.to(tl.int32), axis=1)
        tl.store(sorted_ptr + base + rank, c0 + lane, mask=ids >= 0)
        cursor += tl.sum(onehot, axis=0)


@triton.jit
def _align_sort_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, shift_ptr, R, MAX_BLOCKS, E,
    BLOCK_SIZE_M: tl.constexpr, R_P2: tl.constexpr, BINS: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr,
):
    """``_align_kernel``'s result (the same bytes) from one histogram and one sort of R_P2 keys
    (expert * R_P2 + route) instead of [chunk, E] one-hot tiles: sorted key i of expert e goes to padded
    position i + (padded start - start)[e], staged through ``shift_ptr`` [BINS]; the first route of each
    M block names the block's expert."""
    _pdl_enter(PDL)
    lane = tl.arange(0, R_P2)
    ids = tl.load(ids_ptr + lane, mask=lane < R, other=-1).to(tl.int32)
    active = ids >= 0
    bins = tl.arange(0, BINS)
    counts = tl.where(bins < E, tl.histogram(tl.where(active, ids, E), BINS), 0)
    nblk = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    tl.store(shift_ptr + bins, (tl.cumsum(nblk, 0) - nblk) * BLOCK_SIZE_M - (tl.cumsum(counts, 0) - counts))
    for i0 in range(0, MAX_BLOCKS * BLOCK_SIZE_M, FILL):
        i = i0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + i, tl.zeros([FILL], tl.int32) + R, mask=i < MAX_BLOCKS * BLOCK_SIZE_M)
        tl.store(block_expert_ptr + i, tl.zeros([FILL], tl.int32) - 1, mask=i < MAX_BLOCKS)
    tl.debug_barrier()
    key = tl.sort(tl.where(active, ids, E) * R_P2 + lane)
    expert = key // R_P2
    used = expert < E
    pos = lane + tl.load(shift_ptr + expert, mask=used, other=0)
    tl.store(sorted_ptr + pos, key % R_P2, mask=used)
    tl.store(block_expert_ptr + pos // BLOCK_SIZE_M, expert, mask=used & (pos % BLOCK_SIZE_M == 0))


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
    SPLIT_OUT: tl.constexpr, PDL: tl.constexpr,
):
    """out[r] = act(gate, up), gate/up = the sum of the gate/up GEMM's SPLITS partials [.., :I] / [.., I:];
    inactive routes get zeros, unread. Formulas as in moetune.kernels.activations
    (0 silu, 1 gelu_tanh, 2 swiglu).

    SPLIT_OUT also writes A_FP8 2's split of ``out`` (``_split_rows_kernel``'s terms of the values as
    stored, to the bit) into hi, lo [R, I] and sa [R, chunks]: the down GEMM's input without a launch
    of its own. BLOCK is a multiple of 128 or covers all of I."""
    _pdl_enter(PDL)
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    out_ptrs = out_ptr + r.to(tl.int64) * stride_om + offs
    if tl.load(ids_ptr + r) < 0:
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
        hi_f = _round_e4m3(q)
        term = r.to(tl.int64) * stride_hm + tl.reshape(offs, [BLOCK // CH, CH])
        term_mask = tl.reshape(mask, [BLOCK // CH, CH])
        tl.store(hi_ptr + term, hi_f.to(tl.float8e4nv), mask=term_mask)
        tl.store(lo_ptr + term, _round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv), mask=term_mask)
        chunks = tl.program_id(1) * (BLOCK // CH) + tl.arange(0, BLOCK // CH)
        tl.store(sa_ptr + r.to(tl.int64) * stride_sam + chunks, sa, mask=chunks < CHUNKS_TOTAL)


@triton.jit
def _sum_topk_kernel(y_ptr, ids_ptr, out_ptr, H, TOP_K, stride_ys, stride_ym, stride_om,
                     SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[m] = sum over active routes r of token m and over the down GEMM's SPLITS partials of y[split, r]
    (fp32), cast to out's dtype."""
    _pdl_enter(PDL)
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
    _pdl_enter(PDL)
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
    g = _gemv_tile(a_row, w_e + offs_n[:, None].to(tl.int64) * stride_wn,
                   s_e + ((pid_n * BLOCK_SIZE_N) // 128) * stride_sn, n_mask, 0, K, K, stride_ak, stride_wk,
                   stride_sk, BLOCK_SIZE_N, BLOCK_SIZE_K, False)
    up = I + offs_n
    if UP_ROW_SCALES:
        s_up = s_e + (up // 128) * stride_sn
    else:
        s_up = s_e + ((I + pid_n * BLOCK_SIZE_N) // 128) * stride_sn
    u = _gemv_tile(a_row, w_e + up[:, None].to(tl.int64) * stride_wn, s_up, n_mask, 0, K, K, stride_ak,
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
    _pdl_enter(PDL)
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
            y = _gemv_tile(a_ptr + r.to(tl.int64) * stride_am,
                           w_ptr + e64 * stride_we + offs_n[:, None].to(tl.int64) * stride_wn,
                           s_ptr + e64 * stride_se + s_off, n_mask, 0, K, K, stride_ak, stride_wk, stride_sk,
                           BLOCK_SIZE_N, BLOCK_SIZE_K, False)
            acc += y * tl.load(rw_ptr + r)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _pdl(pdl: bool) -> dict[str, bool]:
    """Kernel arguments for programmatic dependent launch (``_pdl_enter``); the interpreter has no
    concurrent kernels, so it always runs without."""
    on = bool(pdl) and not interpreter_active()
    return {"PDL": on, "launch_pdl": on}


def max_blocks(routes: int, num_experts: int, block_m: int) -> int:
    """Most M blocks any routing of ``routes`` rows over ``num_experts`` experts can fill."""
    return min(routes, triton.cdiv(routes, block_m) + min(num_experts, routes))


# ---- launchers ----------------------------------------------------------------------------------
ALIGN_METHODS = ("onehot", "sort")
# H200, DeepSeek-V3 TP8 (E 256), BM 16: "sort" 3.45 / 3.39 / 3.96 / 5.43 us against "onehot" 4.82 / 4.38 /
# 12.36 / 37.50 us at 8 / 32 / 128 / 512 routes, byte-identical (results/fp8_decode.md, session 2)
ALIGN_METHOD = "sort"
_SORT_MAX_ROUTES = 4096  # one program sorts all routes in registers; above, "onehot" runs instead


def align_routes(topk_ids: torch.Tensor, num_experts: int, block_m: int, method: str | None = None, *,
                 pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket routes by expert: (sorted route ids [max_blocks * block_m] int32, padding = R;
    block_expert [max_blocks] int32, -1 for unused blocks). Within an expert, routes keep their order.

    Sizes depend only on the route count, E and block_m, so this is CUDA-graph capturable. ``method``
    (default ``ALIGN_METHOD``, "sort", the faster one on the H200): "onehot" or "sort" (same result);
    "sort" holds every route in one program's registers, so above 4096 routes "onehot" runs instead."""
    method = method or ALIGN_METHOD
    if method not in ALIGN_METHODS:
        raise ValueError(f"method must be one of {ALIGN_METHODS}, got {method!r}")
    ids = topk_ids.reshape(-1)
    routes = ids.numel()
    nb = max_blocks(routes, num_experts, block_m)
    sorted_ids = torch.empty(nb * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=ids.device)
    if routes and method == "sort" and routes <= _SORT_MAX_ROUTES:
        bins = triton.next_power_of_2(num_experts + 1)
        shift = torch.empty(bins, dtype=torch.int32, device=ids.device)
        _align_sort_kernel[(1,)](ids, sorted_ids, block_expert, shift, routes, nb, num_experts,
                                 BLOCK_SIZE_M=block_m, R_P2=max(16, triton.next_power_of_2(routes)),
                                 BINS=bins, FILL=1024, num_warps=8, **_pdl(pdl))
    elif routes:
        # one program walks every route twice; [CHUNK, E] one-hot tiles of 8K elements measured faster
        # on the H200 than 32K-element ones (12.7 vs 40.7 us at 128 routes over 256 experts)
        e_p2 = triton.next_power_of_2(num_experts)
        chunk = max(16, min(128, 8192 // e_p2))
        _align_kernel[(1,)](ids, sorted_ids, block_expert, routes, nb, num_experts,
                            BLOCK_SIZE_M=block_m, E_P2=e_p2, CHUNK=chunk, FILL=1024, num_warps=8,
                            **_pdl(pdl))
    return sorted_ids, block_expert


SplitRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_SPLIT_CHUNKS = 8  # 128-K chunks per split program (1024 elements)


def _check_split(split: Any, rows: int, k: int, device: torch.device, name: str) -> SplitRows:
    """``split`` as (hi, lo, sa) for ``rows`` rows of length ``k``; ValueError naming ``name`` otherwise."""
    if not (isinstance(split, (tuple, list)) and len(split) == 3
            and all(isinstance(t, torch.Tensor) for t in split)):
        raise ValueError(f"{name} must be a tuple (hi, lo, sa) of 3 tensors, got {type(split).__name__}")
    hi, lo, sa = split
    chunks = triton.cdiv(k, SCALE_BLOCK)
    for term, t in (("hi", hi), ("lo", lo)):
        if t.dtype != FP8_DTYPE or tuple(t.shape) != (rows, k):
            raise ValueError(f"{name}: {term} must be {FP8_DTYPE} [{rows}, {k}], got {t.dtype} "
                             f"{tuple(t.shape)}")
    if lo.stride() != hi.stride():
        raise ValueError(f"{name}: lo must have hi's strides {hi.stride()}, got {lo.stride()}")
    if sa.dtype != torch.float32 or sa.dim() != 2 or sa.shape[0] != rows or sa.shape[1] < chunks:
        raise ValueError(f"{name}: sa must be float32 [{rows}, >= {chunks}] (one scale per row per 128-K "
                         f"chunk), got {sa.dtype} {tuple(sa.shape)}")
    for term, t in (("hi", hi), ("lo", lo), ("sa", sa)):
        if t.device != device:
            raise ValueError(f"{name}: {term} is on {t.device}, expected {device}")
    return hi, lo, sa


def split_fp8_rows(a: torch.Tensor, out: SplitRows | None = None, *, pdl: bool = False) -> SplitRows:
    """A_FP8 2's activation split of ``a [rows, K]`` (any strides, any ``ACT_DTYPES``): per row and 128-K
    chunk, sa = max(amax, 1e-30) / 448, q = a / sa, hi = fp8(q), lo = fp8(8 (q - hi)), so that
    a ~= (hi + lo / 8) * sa within ~1e-3. Returns (hi [rows, K] e4m3, lo [rows, K] e4m3,
    sa [rows, ceil(K / 128)] fp32), written into ``out`` when given (checked like that)."""
    if a.dim() != 2:
        raise ValueError(f"a must have rank 2, got shape {tuple(a.shape)}")
    rows, k = a.shape
    chunks = triton.cdiv(k, SCALE_BLOCK)
    if out is None:
        out = (torch.empty(rows, k, dtype=FP8_DTYPE, device=a.device),
               torch.empty(rows, k, dtype=FP8_DTYPE, device=a.device),
               torch.empty(rows, chunks, dtype=torch.float32, device=a.device))
    hi, lo, sa = _check_split(out, rows, k, a.device, "out")
    if rows and k:
        group = min(_SPLIT_CHUNKS, triton.next_power_of_2(chunks))
        _split_rows_kernel[(rows, triton.cdiv(chunks, group))](
            a, hi, lo, sa, k, chunks, a.stride(0), a.stride(1), hi.stride(0), hi.stride(1), sa.stride(0),
            sa.stride(1), CHUNKS=group, num_warps=4, **_pdl(pdl))
    return hi, lo, sa


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
                   a_split: SplitRows | None = None, pdl: bool = False) -> torch.Tensor:
    """``out[r, :] = (topk_weights[r] *) a[r // a_row_div] @ dequant(w[topk_ids[r]]).T`` for every route r.

    Inputs are assumed checked (``fp8_decode_moe`` or the spec does that). ``out`` is fp32, either
    [SPLIT_K, R, N] (one partial sum per K split, left for the consumer to add: no atomics, no zeroing)
    or [R, N] (the partials are then added here). ``aligned`` is ``align_routes``' result for the
    grouped algorithm (computed here when None). Rows of inactive routes are zero.

    A_FP8 2 runs ``split_fp8_rows(a)`` first (one launch more), unless ``a_split`` gives that split of
    ``a`` (checked: shapes, dtypes; ValueError naming it); ``a_split`` with another A_FP8 is a ValueError.
    ``pdl``: every launch here uses programmatic dependent launch (``_pdl_enter``)."""
    cfg = check_gemm_config(config)
    if a_split is not None:
        if cfg["A_FP8"] != 2:
            raise ValueError(f"a_split is only used with A_FP8 2, got A_FP8 {cfg['A_FP8']}")
        a_split = _check_split(a_split, a.shape[0], a.shape[1], a.device, "a_split")
    split = cfg["SPLIT_K"]
    if out.dim() == 2 and split > 1:
        partials = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
        fp8_block_gemm(a, w, w_scale, topk_ids, partials, cfg, a_row_div=a_row_div,
                       topk_weights=topk_weights, aligned=aligned, a_split=a_split, pdl=pdl)
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
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_pdl(pdl))
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
    zero_programs = triton.cdiv(routes, cfg["BLOCK_SIZE_M"])
    _grouped_gemm_kernel[(nb + zero_programs, n_tiles, split)](
        *a_args, w_arg, w_scale, ids, sorted_ids, block_expert, rw, parts, n, k, routes, nb, a_row_div,
        *a_strides, *w_strides, BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], SWAP_AB=bool(cfg["SWAP_AB"]),
        DOT_FP32=dot_fp32, A_FP8=a_mode, W_TMA=bool(cfg["W_TMA"]), **common)
    return out


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
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_pdl(pdl))
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
            num_stages=cfg["num_stages"], **_pdl(pdl))
    return out


def gated_activation_rows(gu: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, activation: str,
                          limit: float | None = None, pdl: bool = False,
                          split: SplitRows | None = None) -> torch.Tensor:
    """``out [R, I] = act(gate, up)`` per active route, zeros for inactive ones; ``gu`` is the gate/up
    output, [R, 2I] or [splits, R, 2I] partial sums. ``split`` (hi, lo, sa, checked as
    ``split_fp8_rows``' ``out``) also receives ``split_fp8_rows(out)``, bit for bit, in the same launch."""
    routes, inter = out.shape
    parts = gu if gu.dim() == 3 else gu.unsqueeze(0)
    if split is not None:
        if out.stride(1) != 1:
            raise ValueError(f"split needs out with unit stride along I, got strides {out.stride()}")
        hi, lo, sa = _check_split(split, routes, inter, out.device, "split")
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
            SPLIT_OUT=split is not None, num_warps=4, **_pdl(pdl))
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
            SPLITS=parts.shape[0], BLOCK=block, num_warps=4, **_pdl(pdl))
    return out


# ---- public API ---------------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation, swiglu_limit):
    """Shapes (M, H, E, I, top_k); ValueError naming the argument and the expected value otherwise."""
    named = dict(x=x, w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale,
                 topk_weights=topk_weights, topk_ids=topk_ids)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    ranks = dict(x=2, w13=3, w13_scale=3, w2=3, w2_scale=3, topk_weights=2, topk_ids=2)
    for name, rank in ranks.items():
        if named[name].dim() != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {tuple(named[name].shape)}")
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    for name in ("w13", "w2"):
        if named[name].dtype != FP8_DTYPE:
            raise ValueError(f"{name} must be {FP8_DTYPE}, got {named[name].dtype}")
    for name in ("w13_scale", "w2_scale"):
        if named[name].dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name} must be float32 or bfloat16, got {named[name].dtype}")
    if topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    for name, t in named.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, expected x's device {x.device}")
    m, h = x.shape
    e, n13, h13 = w13.shape
    if n13 % 2 or n13 == 0:
        raise ValueError(f"w13 must be [E, 2*I, H] with gate rows then up rows; dim 1 is {n13}, not even")
    inter = n13 // 2
    if h13 != h:
        raise ValueError(f"w13 must be [E, 2*I, {h}] (H from x), got {tuple(w13.shape)}")
    if tuple(w2.shape) != (e, h, inter):
        raise ValueError(f"w2 must be [{e}, {h}, {inter}] (E, H, I from w13 and x), got {tuple(w2.shape)}")
    for name, (rows, cols) in (("w13_scale", (n13, h)), ("w2_scale", (h, inter))):
        s = named[name]
        nb, kb = triton.cdiv(rows, SCALE_BLOCK), triton.cdiv(cols, SCALE_BLOCK)
        if s.shape[0] != e or s.shape[1] != nb or s.shape[2] < kb:
            raise ValueError(f"{name} must be [{e}, {nb}, >= {kb}] (one scale per 128x128 block), "
                             f"got {tuple(s.shape)}")
    if topk_ids.shape[0] != m or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [{m}, top_k] (M from x), got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if swiglu_limit is not None and not (isinstance(swiglu_limit, (int, float))
                                         and 0 < swiglu_limit < float("inf")):
        raise ValueError(f"swiglu_limit must be None or a positive finite number, got {swiglu_limit!r}")
    return m, h, e, inter, topk_ids.shape[1]


# the fused layer measured on the H200 ("fused-1", results/fp8_decode.md, session 2): 2 graph nodes
FUSED_CONFIG: dict[str, dict[str, Any]] = {
    "gate_up": {"ALGO": "route", "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 512, "FUSE": 1, "num_stages": 3},
    "down": {"ALGO": "route", "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "FUSE": 1, "num_stages": 2},
}


def resolve_config(config: Mapping[str, Any] | None, shapes: Mapping[str, dict], routes: int,
                   fused: bool = False) -> dict[str, dict[str, Any]]:
    """Per-GEMM configs: checked ``config`` entries; for missing ones the tile picker's choice, or
    ``FUSED_CONFIG`` with ``fused`` (which then requires FUSE 1 in every given entry)."""
    if not isinstance(fused, bool):
        raise ValueError(f"fused must be True or False, got {fused!r}")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be None or a mapping {{'gate_up': {{...}}, 'down': {{...}}}}, "
                         f"got {type(config).__name__}")
    unknown = set(config) - set(GEMMS)
    if unknown:
        raise ValueError(f"config: unknown key(s) {sorted(unknown)}; expected {list(GEMMS)}")
    out = {}
    for gemm in GEMMS:
        if gemm in config:
            out[gemm] = check_gemm_config(config[gemm], f"config[{gemm!r}]")
            if fused and not out[gemm]["FUSE"]:
                raise ValueError(f"config[{gemm!r}]['FUSE'] must be 1 with fused=True, got 0")
        elif fused:
            out[gemm] = check_gemm_config(FUSED_CONFIG[gemm])
        else:
            from moetune.tables.picker import pick_config

            out[gemm] = check_gemm_config(pick_config(f"fp8_decode.{gemm}", shapes[gemm], routes),
                                          f"picked config for fp8_decode.{gemm}")
    return out


def fp8_decode_moe(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                   w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   activation: str = "silu", swiglu_limit: float | None = None,
                   config: Mapping[str, Any] | None = None, fused: bool = False, validate: bool = False,
                   pdl: bool | None = None) -> torch.Tensor:
    """MoE layer output ``[M, H]`` in x's dtype for block-FP8 experts; routes with id -1 contribute 0.

    Shapes: x [M, H]; w13 [E, 2I, H] fp8 (gate rows, then up rows); w13_scale [E, ceil(2I/128),
    >= ceil(H/128)]; w2 [E, H, I] fp8; w2_scale [E, ceil(H/128), >= ceil(I/128)]; topk_weights [M, top_k]
    fp32; topk_ids [M, top_k] int32/int64 in [-1, E). ``config``: ``{"gate_up": {...}, "down": {...}}``
    tile parameters (``GEMM_DEFAULT`` keys); missing GEMMs use ``moetune.tables.picker.pick_config``.
    ``validate=True`` checks the ids (one host sync); otherwise the path never syncs.

    ``fused=True`` runs the layer as 2 launches (activation inside gate/up, top_k sum inside down;
    ``FUSED_CONFIG`` unless ``config`` gives FUSE configs) instead of 4-5. It pays only when (nearly)
    every route is inactive, where the layer is its fixed cost. H200, DeepSeek-V3 TP8, whole layer under
    a CUDA graph, against the unfused layer with session 1's best tiles: at 0/8 active 3.9 / 4.9 / 9.4 /
    29.9 us vs 6.1 / 8.8 / 14.6 / 64.0 us at 1 / 4 / 16 / 64 tokens. It does not pay with active routes:
    its GEMVs have no split-K, so at 8/8 active it takes 82.3 / 102.8 / 241.2 / 837.4 us vs 27.1 / 70.5 /
    198.6 / 506.5 us (3x slower at 1 token), and at 2/8 it loses at 1 / 4 / 16 tokens (76.8 vs 19.9 us at
    1 token) and ties at 64 (259.3 vs 270.6 us).

    ``pdl=True`` launches every kernel with programmatic dependent launch (sm_90+; ignored by the
    interpreter): each waits for the previous kernel's writes at its start, and lets the next one launch
    right after, so at decode the launches overlap instead of following each other. ``None`` (default):
    on for sm_90 and newer. H200, DeepSeek-V3 TP8, tuned layer under a CUDA graph: 27.95 -> 25.28 /
    70.37 -> 66.88 / 181.9 -> 179.9 / 375.8 -> 374.2 us at 1 / 4 / 16 / 64 tokens (results/fp8_decode.md).
    """
    if pdl is None:
        pdl = x.is_cuda and torch.cuda.get_device_capability(x.device) >= (9, 0)
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl must be True, False or None, got {pdl!r}")
    m, h, e, inter, top_k = _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                          activation, swiglu_limit)
    dtype = _dtype_name(x.dtype)
    shapes = gemm_shapes(e, h, inter, top_k, dtype)
    cfg = resolve_config(config, shapes, m * top_k, fused)
    if validate and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < -1 or hi >= e:
            raise ValueError(f"topk_ids must lie in [-1, {e}), got values in [{lo}, {hi}]")
    if m == 0:
        return x.new_empty((0, h))
    buffers = layer_buffers(m, top_k, h, inter, x.dtype, cfg, x.device)
    return decode_moe_into(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, cfg, buffers,
                           activation, swiglu_limit, pdl)


def layer_buffers(m: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype,
                  config: Mapping[str, dict], device) -> dict[str, torch.Tensor]:
    """Uninitialised buffers for ``decode_moe_into``: fp32 K-split partials of both GEMMs, the activation
    in x's dtype (and its A_FP8 2 split, hi / lo / sa, where the down GEMM reads one the activation
    writes), the output. Sizes depend only on M, top_k, the shapes and the config."""
    routes = m * top_k
    splits = {g: 0 if config[g].get("FUSE") else config[g]["SPLIT_K"] for g in GEMMS}  # FUSE: unused
    bufs = {"gate_up": torch.empty(splits["gate_up"], routes, 2 * inter, device=device),
            "act": torch.empty(routes, inter, dtype=dtype, device=device),
            "down": torch.empty(splits["down"], routes, hidden, device=device),
            "out": torch.empty(m, hidden, dtype=dtype, device=device)}
    if _act_split(config):
        bufs["act_hi"] = torch.empty(routes, inter, dtype=FP8_DTYPE, device=device)
        bufs["act_lo"] = torch.empty(routes, inter, dtype=FP8_DTYPE, device=device)
        bufs["act_sa"] = torch.empty(routes, triton.cdiv(inter, SCALE_BLOCK), device=device)
    return bufs


def _act_split(config: Mapping[str, dict]) -> bool:
    """Does the gated activation write the down GEMM's A_FP8 2 split (one launch less)?"""
    gate_up, down = config["gate_up"], config["down"]
    return not gate_up.get("FUSE") and not down.get("FUSE") and down.get("A_FP8") == 2


def decode_moe_into(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, config: Mapping[str, dict],
                    buffers: Mapping[str, torch.Tensor], activation: str = "silu",
                    swiglu_limit: float | None = None, pdl: bool = False) -> torch.Tensor:
    """The launches of ``fp8_decode_moe`` on checked inputs and resolved configs, writing the caller's
    ``buffers`` (``layer_buffers``), so a CUDA-graph test can poison every intermediate before a replay.
    Returns ``buffers["out"]``. ``pdl``: every Triton launch uses programmatic dependent launch."""
    e, top_k = w13.shape[0], topk_ids.shape[1]
    ids = topk_ids.reshape(-1).contiguous()
    rw = topk_weights.reshape(-1).contiguous()
    aligned: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for c in config.values():
        if c["ALGO"] == "grouped" and c["BLOCK_SIZE_M"] not in aligned:
            aligned[c["BLOCK_SIZE_M"]] = align_routes(ids, e, c["BLOCK_SIZE_M"], pdl=pdl)
    gu, act = buffers["gate_up"], buffers["act"]
    split = (buffers["act_hi"], buffers["act_lo"], buffers["act_sa"]) if _act_split(config) else None
    if config["gate_up"].get("FUSE"):
        fused_gate_up_act(x, w13, w13_scale, ids, act, config["gate_up"], activation, swiglu_limit, pdl=pdl)
    else:
        fp8_block_gemm(x, w13, w13_scale, ids, gu, config["gate_up"], a_row_div=top_k,
                       aligned=aligned.get(config["gate_up"]["BLOCK_SIZE_M"]), pdl=pdl)
        gated_activation_rows(gu, ids, act, activation, swiglu_limit, pdl=pdl, split=split)
    if config["down"].get("FUSE"):
        return fused_down_sum(act, w2, w2_scale, ids, rw, buffers["out"], config["down"], pdl=pdl)
    fp8_block_gemm(act, w2, w2_scale, ids, buffers["down"], config["down"], topk_weights=rw,
                   aligned=aligned.get(config["down"]["BLOCK_SIZE_M"]),
                   a_split=split, pdl=pdl)
    return sum_topk(buffers["down"], ids, buffers["out"], pdl=pdl)


def fp8_decode_moe_reference(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                             w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                             activation: str = "silu", swiglu_limit: float | None = None,
                             config: Mapping[str, Any] | None = None, fused: bool = False,
                             validate: bool = False, pdl: bool = False) -> torch.Tensor:
    """fp32 torch on the dequantized weights of the experts actually routed to (``config``, ``fused``,
    ``pdl`` ignored);
    inactive routes contribute 0 and their experts' storage is never read."""
    m, h, e, inter, top_k = _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
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
