"""Route alignment for the grouped GEMM: routes bucketed by expert on the GPU, each bucket padded to
BLOCK_SIZE_M.

Buffers are sized from the route count, E and BLOCK_SIZE_M only (``max_blocks``), so alignment needs no
host sync and replays from a CUDA graph while the routing changes. Two kernels give the same bytes:
"onehot" (one-hot sums over [chunk, E] tiles) and "sort" (one histogram and one sort); see
docs/kernels/fp8_decode.md, ALIGN_METHOD.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from moetune.kernels.fp8_decode.pdl import pdl_args, pdl_enter


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, used_ptr, R, MAX_BLOCKS, E,
    BLOCK_SIZE_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: bucket the active routes by expert, each bucket padded to BLOCK_SIZE_M.

    Writes block_expert[b] (expert of M block b, -1 past the used blocks), sorted[b * BLOCK_SIZE_M + i]
    (route ids, R for padding) and used[0] (the used blocks). Counts and ranks come from one-hot sums, so
    the result is deterministic."""
    pdl_enter(PDL)
    experts = tl.arange(0, E_P2)
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([E_P2], tl.int32)
    for c0 in range(0, R, CHUNK):
        ids = tl.load(ids_ptr + c0 + lane, mask=c0 + lane < R, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    nblk = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    ends = tl.cumsum(nblk, 0)
    cursor = (ends - nblk) * BLOCK_SIZE_M
    tl.store(used_ptr, tl.sum(nblk, 0))
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
    ids_ptr, sorted_ptr, block_expert_ptr, used_ptr, shift_ptr, R, MAX_BLOCKS, E,
    BLOCK_SIZE_M: tl.constexpr, R_P2: tl.constexpr, BINS: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr,
):
    """``_align_kernel``'s result (the same bytes) from one histogram and one sort of R_P2 keys
    (expert * R_P2 + route) instead of [chunk, E] one-hot tiles: sorted key i of expert e goes to padded
    position i + (padded start - start)[e], staged through ``shift_ptr`` [BINS]; the first route of each
    M block names the block's expert."""
    pdl_enter(PDL)
    lane = tl.arange(0, R_P2)
    ids = tl.load(ids_ptr + lane, mask=lane < R, other=-1).to(tl.int32)
    active = ids >= 0
    bins = tl.arange(0, BINS)
    counts = tl.where(bins < E, tl.histogram(tl.where(active, ids, E), BINS), 0)
    nblk = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    tl.store(shift_ptr + bins, (tl.cumsum(nblk, 0) - nblk) * BLOCK_SIZE_M - (tl.cumsum(counts, 0) - counts))
    tl.store(used_ptr, tl.sum(nblk, 0))
    for i0 in range(0, MAX_BLOCKS * BLOCK_SIZE_M, FILL):
        i = i0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + i, tl.zeros([FILL], tl.int32) + R, mask=i < MAX_BLOCKS * BLOCK_SIZE_M)
        tl.store(block_expert_ptr + i, tl.zeros([FILL], tl.int32) - 1, mask=i < MAX_BLOCKS)
    tl.debug_barrier()
    if tl.sum(active.to(tl.int32), 0) > 0:  # with no active route the sort is most of an idle layer's time
        key = tl.sort(tl.where(active, ids, E) * R_P2 + lane)
        expert = key // R_P2
        used = expert < E
        pos = lane + tl.load(shift_ptr + expert, mask=used, other=0)
        tl.store(sorted_ptr + pos, key % R_P2, mask=used)
        tl.store(block_expert_ptr + pos // BLOCK_SIZE_M, expert, mask=used & (pos % BLOCK_SIZE_M == 0))


class RouteBlocks(NamedTuple):
    """``align_routes``' result: routes bucketed by expert in M blocks of BLOCK_SIZE_M."""

    sorted_ids: torch.Tensor  # int32 [max_blocks * block_m]: route ids, R for padding
    block_expert: torch.Tensor  # int32 [max_blocks]: expert of each block, -1 past the used ones
    used_blocks: torch.Tensor  # int32 [1]: blocks in use (a prefix), for grids that loop over them


def max_blocks(routes: int, num_experts: int, block_m: int) -> int:
    """Most M blocks any routing of ``routes`` rows over ``num_experts`` experts can fill."""
    return min(routes, triton.cdiv(routes, block_m) + min(num_experts, routes))


ALIGN_METHODS = ("onehot", "sort")
# "sort" was the faster on the H200 at every route count measured (docs/kernels/fp8_decode.md, ALIGN_METHOD)
ALIGN_METHOD = "sort"
_SORT_MAX_ROUTES = 4096  # one program sorts all routes in registers; above, "onehot" runs instead


def align_routes(topk_ids: torch.Tensor, num_experts: int, block_m: int, method: str | None = None, *,
                 pdl: bool = False) -> RouteBlocks:
    """Bucket routes by expert (``RouteBlocks``: sorted route ids, padding = R; each block's expert, -1
    for unused blocks; the count of used blocks). Within an expert, routes keep their order.

    Sizes depend only on the route count, E and block_m, so this is CUDA-graph capturable. ``method``
    (default ``ALIGN_METHOD``): "onehot" or "sort" (same result); "sort" holds every route in one
    program's registers, so above ``_SORT_MAX_ROUTES`` (4096) routes "onehot" runs instead."""
    method = method or ALIGN_METHOD
    if method not in ALIGN_METHODS:
        raise ValueError(f"method must be one of {ALIGN_METHODS}, got {method!r}")
    ids = topk_ids.reshape(-1)
    routes = ids.numel()
    nb = max_blocks(routes, num_experts, block_m)
    sorted_ids = torch.empty(nb * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=ids.device)
    used = torch.empty(1, dtype=torch.int32, device=ids.device)
    if routes and method == "sort" and routes <= _SORT_MAX_ROUTES:
        bins = triton.next_power_of_2(num_experts + 1)
        shift = torch.empty(bins, dtype=torch.int32, device=ids.device)
        _align_sort_kernel[(1,)](ids, sorted_ids, block_expert, used, shift, routes, nb, num_experts,
                                 BLOCK_SIZE_M=block_m, R_P2=max(16, triton.next_power_of_2(routes)),
                                 BINS=bins, FILL=1024, num_warps=8, **pdl_args(pdl))
    elif routes:
        # one program walks every route twice, in [CHUNK, E] one-hot tiles of at most 8K elements:
        # larger tiles were slower on the H200 (docs/kernels/fp8_decode.md, ALIGN_METHOD)
        e_p2 = triton.next_power_of_2(num_experts)
        chunk = max(16, min(128, 8192 // e_p2))
        _align_kernel[(1,)](ids, sorted_ids, block_expert, used, routes, nb, num_experts,
                            BLOCK_SIZE_M=block_m, E_P2=e_p2, CHUNK=chunk, FILL=1024, num_warps=8,
                            **pdl_args(pdl))
    return RouteBlocks(sorted_ids, block_expert, used)
