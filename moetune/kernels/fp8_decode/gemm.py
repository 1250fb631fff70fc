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

from moetune.device import device_info, interpreter_active
from moetune.kernels.fp8_decode.align import RouteBlocks, align_routes
from moetune.kernels.fp8_decode.config import SCALE_BLOCK, check_gemm_config
from moetune.kernels.fp8_decode.pdl import pdl_args, pdl_enter
from moetune.kernels.fp8_decode.split import SplitRows, check_split, split_fp8_rows
from moetune.kernels.fp8_decode.tiles import block_tile, gemv_tile, gemv_tile_prefetch

PERSISTENT_MAX_ROUTES = 4096  # the route kernels' persistent grid ranks every route id in registers


# A K split reaches the kernels here and below as SPLIT_ITERS, the K blocks each split takes (computed on
# the host, never specialized): it only sets each program's K range, so every split of a tile runs one
# binary and a sweep compiles a fraction of the space (docs/kernels/fp8_decode.md, SPLIT_K). A count, not
# SPLIT_K itself: no division per program, and k_start stays a known multiple of BLOCK_SIZE_K (aligned loads).
#
# PERSISTENT (docs/kernels/fp8_decode.md, PERSISTENT): a grid of a few programs per SM that loops over the
# tiles of the active routes (route kernels) or used M blocks (grouped), in the order the one-tile grid's
# programs would start (route or block fastest, then N tile, then K split). Inactive routes then cost no
# programs: an all-inactive launch is that many programs reading the route ids and leaving.


@triton.jit
def _active_routes(ids_ptr, R, R_P2: tl.constexpr):
    """The route lanes, their active flags (int32) and the flags' inclusive prefix sum."""
    lane = tl.arange(0, R_P2)
    active = (tl.load(ids_ptr + lane, mask=lane < R, other=-1) >= 0).to(tl.int32)
    return lane, active, tl.cumsum(active, 0)


@triton.jit
def _route_tile(t, lane, flags, prefix, count, n_tiles):
    """Tile ``t`` of the flagged routes' tiles, route fastest: (route, N tile, K split). ``count`` routes
    are flagged; ``prefix``: the flags' inclusive prefix sum (the route is the (j + 1)-th flagged lane)."""
    j = t % count
    rest = t // count
    return tl.sum(tl.where((flags != 0) & (prefix == j + 1), lane, 0), 0), rest % n_tiles, rest // n_tiles


@triton.jit
def _gemv_route_tile(
    a_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, e, pid_n, pid_k, N, K, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_os, stride_om, APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, PREFETCH: tl.constexpr, GEMV_STAGES: tl.constexpr,
):
    """out[pid_k, r, N tile pid_n] of active route r on expert e (``_route_gemm_kernel``)."""
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    e64 = e.to(tl.int64)
    a_row = a_ptr + (r // A_ROW_DIV).to(tl.int64) * stride_am
    w_rows = w_ptr + e64 * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    s_row = s_ptr + e64 * stride_se + ((pid_n * BLOCK_SIZE_N) // 128) * stride_sn
    k_start = pid_k * SPLIT_ITERS * BLOCK_SIZE_K
    k_end = tl.minimum(K, k_start + SPLIT_ITERS * BLOCK_SIZE_K)
    if PREFETCH:
        res = gemv_tile_prefetch(a_row, w_rows, s_row, n_mask, k_start, k_end, K, stride_ak, stride_wk,
                                 stride_sk, BLOCK_SIZE_N)
    else:
        res = gemv_tile(a_row, w_rows, s_row, n_mask, k_start, k_end, K, stride_ak, stride_wk, stride_sk,
                        BLOCK_SIZE_N, BLOCK_SIZE_K, False, GEMV_STAGES)
    if APPLY_WEIGHT:
        res = res * tl.load(rw_ptr + r)
    tl.store(out_ptr + pid_k * stride_os + r.to(tl.int64) * stride_om + offs_n, res, mask=n_mask)


@triton.jit
def _zero_route_tile(out_ptr, r, pid_n, pid_k, N, stride_os, stride_om, BLOCK_SIZE_N: tl.constexpr):
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    tl.store(out_ptr + pid_k * stride_os + r.to(tl.int64) * stride_om + offs_n,
             tl.zeros([BLOCK_SIZE_N], tl.float32), mask=offs_n < N)


@triton.jit
def _zero_inactive_tiles(ids_ptr, out_ptr, R, N, SPLITS, stride_os, stride_om, BLOCK_SIZE_N: tl.constexpr,
                         R_P2: tl.constexpr):
    """PERSISTENT with FILL_INACTIVE: this program's share of the inactive routes' zero tiles."""
    lane, active, _ = _active_routes(ids_ptr, R, R_P2)
    idle = (lane < R).to(tl.int32) - active
    prefix = tl.cumsum(idle, 0)
    n_idle = tl.sum(idle, 0)
    n_tiles = tl.cdiv(N, BLOCK_SIZE_N)
    for t in range(tl.program_id(0), n_idle * n_tiles * SPLITS, tl.num_programs(0)):
        r, pid_n, pid_k = _route_tile(t, lane, idle, prefix, n_idle, n_tiles)
        _zero_route_tile(out_ptr, r, pid_n, pid_k, N, stride_os, stride_om, BLOCK_SIZE_N)


@triton.jit(do_not_specialize=["SPLIT_ITERS", "SPLITS"])
def _route_gemm_kernel(
    a_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr,
    N, K, R, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, SPLITS, PREFETCH: tl.constexpr, GEMV_STAGES: tl.constexpr, FILL_INACTIVE: tl.constexpr,
    PERSISTENT: tl.constexpr, R_P2: tl.constexpr, PDL: tl.constexpr,
):
    """out[split, r, n] = rw[r] * sum over the split's K range of a[r // A_ROW_DIV, k] * w[ids[r], n, k]
    * scale. A_ROW_DIV (top_k for gate/up, 1 for down) is a constexpr so that no program divides at run
    time. BLOCK_SIZE_N <= 128: the tile lies in one scale row, so the scale folds into the activation.
    PREFETCH (BLOCK_SIZE_K 128): ``gemv_tile_prefetch``. Grid: one program per (route, N tile, K split),
    or with PERSISTENT a few per SM over the active routes' tiles (R_P2: R rounded up to a power of two)."""
    pdl_enter(PDL)
    if PERSISTENT:
        lane, active, prefix = _active_routes(ids_ptr, R, R_P2)
        n_active = tl.sum(active, 0)
        n_tiles = tl.cdiv(N, BLOCK_SIZE_N)
        for t in range(tl.program_id(0), n_active * n_tiles * SPLITS, tl.num_programs(0)):
            r, pid_n, pid_k = _route_tile(t, lane, active, prefix, n_active, n_tiles)
            _gemv_route_tile(a_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, tl.load(ids_ptr + r), pid_n, pid_k, N,
                             K, A_ROW_DIV, stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se,
                             stride_sn, stride_sk, stride_os, stride_om, APPLY_WEIGHT, BLOCK_SIZE_N,
                             BLOCK_SIZE_K, SPLIT_ITERS, PREFETCH, GEMV_STAGES)
        if FILL_INACTIVE:
            _zero_inactive_tiles(ids_ptr, out_ptr, R, N, SPLITS, stride_os, stride_om, BLOCK_SIZE_N, R_P2)
    else:
        r = tl.program_id(0)
        e = tl.load(ids_ptr + r)
        if e < 0:
            if FILL_INACTIVE:
                _zero_route_tile(out_ptr, r, tl.program_id(1), tl.program_id(2), N, stride_os, stride_om,
                                 BLOCK_SIZE_N)
        else:
            _gemv_route_tile(a_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, e, tl.program_id(1), tl.program_id(2),
                             N, K, A_ROW_DIV, stride_am, stride_ak, stride_we, stride_wn, stride_wk,
                             stride_se, stride_sn, stride_sk, stride_os, stride_om, APPLY_WEIGHT,
                             BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, PREFETCH, GEMV_STAGES)


@triton.jit
def _zero_inactive_rows(ids_ptr, out_ptr, block, R, offs_n, n_mask, stride_om,
                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Zeros in this N tile of the inactive routes among rows [block * BLOCK_SIZE_M, +BLOCK_SIZE_M)."""
    rows = block * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    ids = tl.load(ids_ptr + rows, mask=rows < R, other=0)
    zero = tl.zeros([BLOCK_SIZE_M, BLOCK_SIZE_N], tl.float32)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :], zero,
             mask=(ids < 0)[:, None] & n_mask[None, :])


@triton.jit
def _grouped_tile(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, sorted_ptr, rw_ptr, out_ptr, e, pid_m, pid_n, pid_k, N, K, R,
    A_ROW_DIV: tl.constexpr, stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk, stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, SPLIT_ITERS, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr,
    A_FP8: tl.constexpr, W_TMA: tl.constexpr,
):
    """Used M block pid_m (expert e) x N tile pid_n over K split pid_k (``_grouped_gemm_kernel``)."""
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    rows = tl.load(sorted_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    block_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr + pid_k * stride_os, e, rows, rows < R,
               pid_n * BLOCK_SIZE_N, offs_n, offs_n < N, pid_k, N, K, A_ROW_DIV, stride_am, stride_ak,
               stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
               stride_om, APPLY_WEIGHT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, SWAP_AB,
               DOT_FP32, A_FP8, W_TMA)


@triton.jit(do_not_specialize=["NUM_BLOCKS", "SPLIT_ITERS", "SPLITS"])  # NUM_BLOCKS moves with E, routes
def _grouped_gemm_kernel(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, ids_ptr, sorted_ptr, block_expert_ptr, used_ptr, rw_ptr, out_ptr,
    N, K, R, NUM_BLOCKS, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, SPLIT_ITERS, SPLITS, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr,
    A_FP8: tl.constexpr, W_TMA: tl.constexpr, FILL_INACTIVE: tl.constexpr, PERSISTENT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Expert-grouped product over ``align_routes``' M blocks (NUM_BLOCKS of them, the first used_ptr[0]
    in use). One-tile grid: program (m, n tile, K split) takes block m, blocks past the used ones exit at
    once, and programs past NUM_BLOCKS write the zero rows of inactive routes. PERSISTENT: a few programs
    per SM loop over the used blocks' tiles, then the zero tiles. ``lo_ptr``, ``sa_ptr``: as
    ``block_tile`` (A_FP8 2 only)."""
    pdl_enter(PDL)
    n_tiles = tl.cdiv(N, BLOCK_SIZE_N)
    if PERSISTENT:
        used = tl.load(used_ptr)
        for t in range(tl.program_id(0), used * n_tiles * SPLITS, tl.num_programs(0)):
            pid_m = t % used
            rest = t // used
            _grouped_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, sorted_ptr, rw_ptr, out_ptr,
                          tl.load(block_expert_ptr + pid_m), pid_m, rest % n_tiles, rest // n_tiles, N, K, R,
                          A_ROW_DIV, stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn,
                          stride_wk, stride_se, stride_sn, stride_sk, stride_os, stride_om, APPLY_WEIGHT,
                          BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, SWAP_AB, DOT_FP32, A_FP8,
                          W_TMA)
        if FILL_INACTIVE:
            zero_blocks = tl.cdiv(R, BLOCK_SIZE_M)
            for t in range(tl.program_id(0), zero_blocks * n_tiles * SPLITS, tl.num_programs(0)):
                rest = t // zero_blocks
                offs_n = (rest % n_tiles) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
                _zero_inactive_rows(ids_ptr, out_ptr + (rest // n_tiles) * stride_os, t % zero_blocks, R,
                                    offs_n, offs_n < N, stride_om, BLOCK_SIZE_M, BLOCK_SIZE_N)
    else:
        pid_m = tl.program_id(0)
        if pid_m >= NUM_BLOCKS:
            if FILL_INACTIVE:
                offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
                _zero_inactive_rows(ids_ptr, out_ptr + tl.program_id(2) * stride_os, pid_m - NUM_BLOCKS, R,
                                    offs_n, offs_n < N, stride_om, BLOCK_SIZE_M, BLOCK_SIZE_N)
        else:
            e = tl.load(block_expert_ptr + pid_m)
            if e >= 0:  # within the blocks this routing uses
                _grouped_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, sorted_ptr, rw_ptr, out_ptr, e, pid_m,
                              tl.program_id(1), tl.program_id(2), N, K, R, A_ROW_DIV, stride_am, stride_ak,
                              stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
                              stride_sk, stride_os, stride_om, APPLY_WEIGHT, BLOCK_SIZE_M, BLOCK_SIZE_N,
                              BLOCK_SIZE_K, SPLIT_ITERS, SWAP_AB, DOT_FP32, A_FP8, W_TMA)


@triton.jit
def _dot_route_tile(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, e, pid_n, pid_k, N, K, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, stride_os, stride_om, APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, SPLIT_ITERS, DOT_FP32: tl.constexpr, A_FP8: tl.constexpr, W_TMA: tl.constexpr,
):
    """Active route r (expert e) x N tile pid_n over K split pid_k on tensor cores (``_route_dot_kernel``)."""
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    lanes = tl.arange(0, 16)
    block_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr + pid_k * stride_os, e, r + lanes * 0,
               lanes == 0, pid_n * BLOCK_SIZE_N, offs_n, offs_n < N, pid_k, N, K, A_ROW_DIV, stride_am,
               stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
               stride_sk, stride_om, APPLY_WEIGHT, 16, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, True,
               DOT_FP32, A_FP8, W_TMA)


@triton.jit(do_not_specialize=["SPLIT_ITERS", "SPLITS"])
def _route_dot_kernel(
    a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr, N, K, R, A_ROW_DIV: tl.constexpr,
    stride_am, stride_ak, stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, stride_os, stride_om,
    APPLY_WEIGHT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    SPLIT_ITERS, SPLITS, DOT_FP32: tl.constexpr, A_FP8: tl.constexpr, W_TMA: tl.constexpr,
    FILL_INACTIVE: tl.constexpr, PERSISTENT: tl.constexpr, R_P2: tl.constexpr, PDL: tl.constexpr,
):
    """The route grid on tensor cores (A_FP8 1 or 2): program (route, N tile, K split) runs ``block_tile``
    with its one route in column 0 of a 16-wide block (the other columns masked off: MMA work is free at
    decode, and no fp8 weight is converted on the CUDA cores). PERSISTENT: as ``_route_gemm_kernel``."""
    pdl_enter(PDL)
    if PERSISTENT:
        lane, active, prefix = _active_routes(ids_ptr, R, R_P2)
        n_active = tl.sum(active, 0)
        n_tiles = tl.cdiv(N, BLOCK_SIZE_N)
        for t in range(tl.program_id(0), n_active * n_tiles * SPLITS, tl.num_programs(0)):
            r, pid_n, pid_k = _route_tile(t, lane, active, prefix, n_active, n_tiles)
            _dot_route_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, tl.load(ids_ptr + r),
                            pid_n, pid_k, N, K, A_ROW_DIV, stride_am, stride_ak,
                            stride_sam, stride_sac, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
                            stride_sk, stride_os, stride_om, APPLY_WEIGHT, BLOCK_SIZE_N, BLOCK_SIZE_K,
                            SPLIT_ITERS, DOT_FP32, A_FP8, W_TMA)
        if FILL_INACTIVE:
            _zero_inactive_tiles(ids_ptr, out_ptr, R, N, SPLITS, stride_os, stride_om, BLOCK_SIZE_N, R_P2)
    else:
        r = tl.program_id(0)
        e = tl.load(ids_ptr + r)
        if e < 0:
            if FILL_INACTIVE:
                _zero_route_tile(out_ptr, r, tl.program_id(1), tl.program_id(2), N, stride_os, stride_om,
                                 BLOCK_SIZE_N)
        else:
            _dot_route_tile(a_ptr, lo_ptr, sa_ptr, w_ptr, s_ptr, rw_ptr, out_ptr, r, e, tl.program_id(1),
                            tl.program_id(2), N, K, A_ROW_DIV, stride_am, stride_ak, stride_sam, stride_sac,
                            stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_os,
                            stride_om, APPLY_WEIGHT, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_ITERS, DOT_FP32, A_FP8,
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
                   aligned: RouteBlocks | None = None,
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
                  BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], SPLIT_ITERS=iters, SPLITS=split,
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
    programs = cfg["PERSISTENT"] * device_info(a.device.index).sm_count if cfg["PERSISTENT"] else 0
    if cfg["ALGO"] == "route":
        tiles = routes * n_tiles * split
        # in-kernel compaction holds every route id in registers: above PERSISTENT_MAX_ROUTES, one tile each
        persistent = bool(programs) and routes <= PERSISTENT_MAX_ROUTES and programs < tiles
        grid = (programs,) if persistent else (routes, n_tiles, split)
        route = dict(PERSISTENT=persistent, R_P2=triton.next_power_of_2(routes) if persistent else 1)
        if a_mode:
            _route_dot_kernel[grid](
                *a_args, w_arg, w_scale, ids, rw, parts, n, k, routes, a_row_div, *a_strides, *w_strides,
                DOT_FP32=dot_fp32, A_FP8=a_mode, W_TMA=bool(cfg["W_TMA"]), **route, **common)
        else:
            _route_gemm_kernel[grid](
                a, w, w_scale, ids, rw, parts, n, k, routes, a_row_div, a.stride(0), a.stride(1), *w_strides,
                PREFETCH=bool(cfg["PREFETCH"]), GEMV_STAGES=cfg["GEMV_STAGES"], **route, **common)
        return out
    if aligned is None:
        aligned = align_routes(ids, w.shape[0], cfg["BLOCK_SIZE_M"], pdl=pdl)
    sorted_ids, block_expert, used = aligned
    nb = block_expert.numel()
    zero_programs = triton.cdiv(routes, cfg["BLOCK_SIZE_M"]) if fill_inactive else 0
    tiles = (nb + zero_programs) * n_tiles * split
    persistent = bool(programs) and programs < tiles
    grid = (programs,) if persistent else (nb + zero_programs, n_tiles, split)
    _grouped_gemm_kernel[grid](
        *a_args, w_arg, w_scale, ids, sorted_ids, block_expert, used, rw, parts, n, k, routes, nb, a_row_div,
        *a_strides, *w_strides, BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], SWAP_AB=bool(cfg["SWAP_AB"]),
        DOT_FP32=dot_fp32, A_FP8=a_mode, W_TMA=bool(cfg["W_TMA"]), PERSISTENT=persistent, **common)
    return out
