"""Route alignment for grouped GEMMs: sort routes by expert, pad each expert to whole M-blocks.

Two Triton launches over chunks of ``CHUNK`` routes (docs/kernels/fp4_prefill.md, "Route alignment"):
``_chunk_histograms`` counts each chunk's routes per expert and fills every slot with the sentinel,
``_scatter_routes`` ranks each chunk's routes stably (one sort of expert-major keys) and writes them at
their expert's padded start plus the routes of that expert in earlier chunks. Everything is sized from
the worst case (``routes + E * (block_m - 1)`` slots), so nothing reads a count back to the host: the
path stays CUDA-graph capturable and the GEMM's programs past the padded count exit early.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Alignment:
    """``sorted_ids[slot]`` is a flat route id (``token * top_k + j``) or the sentinel ``routes``;
    ``expert_ids[block]`` the expert of M-block ``block`` (-1 past the padded count);
    ``num_padded[0]`` the number of slots in use (a multiple of ``block_m``)."""

    sorted_ids: torch.Tensor  # int32 [max_slots]
    expert_ids: torch.Tensor  # int32 [max_slots // block_m]
    num_padded: torch.Tensor  # int32 [1]
    block_m: int
    routes: int

    @property
    def max_blocks(self) -> int:
        return self.expert_ids.numel()


def max_slots(routes: int, num_experts: int, block_m: int) -> int:
    """Slots the worst case needs: every expert may waste ``block_m - 1`` rows of padding."""
    slots = routes + num_experts * (block_m - 1)
    return -(-slots // block_m) * block_m


@triton.jit
def _exchange(h, bit, axis: tl.constexpr, stage: tl.constexpr, N: tl.constexpr):
    """One compare-exchange step of ``_sort``: partners differ in index bit N - 1 - axis."""
    partner = tl.sum(h, axis, keep_dims=True) - h
    flip = tl.reshape(bit, [1] * axis + [2] + [1] * (N - 1 - axis))  # 1: the right partner
    if stage < N:  # descending runs where index bit `stage` is set
        flip = flip ^ tl.reshape(bit, [1] * (N - 1 - stage) + [2] + [1] * stage)
    return tl.where((h > partner) != (flip == 1), partner, h)


@triton.jit
def _sort(x, N: tl.constexpr):
    """Ascending bitonic sort of 2 ** N distinct int32 keys: ``tl.sort``'s hypercube network with the
    partner found by a sum, not a xor reduction (which the interpreter runs element by element)."""
    h = tl.reshape(x, [2] * N)
    bit = tl.arange(0, 2)
    for stage in tl.static_range(1, N + 1):
        for j in tl.static_range(stage):
            # the axis goes in as an argument: Triton 3.6 refuses a constexpr local reassigned per step
            h = _exchange(h, bit, N - stage + j, stage, N)
    return tl.reshape(h, x.shape)


@triton.jit
def _chunk_histograms(ids_ptr, hist_ptr, sorted_ptr, expert_ptr, routes, chunks, slots, blocks, E,
                      CHUNK: tl.constexpr, E_P2: tl.constexpr, BINS: tl.constexpr):
    """Program p: hist[p, e] = routes of chunk p on expert e (p < chunks); slots and blocks
    [p * CHUNK, (p + 1) * CHUNK) filled with the sentinel and -1."""
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < routes, other=-1)
    key = tl.where((ids >= 0) & (ids < E), ids, E).to(tl.int32)  # E: dropped routes' bin
    bins = tl.arange(0, BINS)
    if pid < chunks:
        tl.store(hist_ptr + pid * E_P2 + bins, tl.histogram(key, BINS), mask=bins < E)
    tl.store(sorted_ptr + offs, tl.zeros([CHUNK], tl.int32) + routes, mask=offs < slots)
    tl.store(expert_ptr + offs, tl.zeros([CHUNK], tl.int32) - 1, mask=offs < blocks)


@triton.jit
def _scatter_routes(ids_ptr, hist_ptr, shift_ptr, sorted_ptr, expert_ptr, padded_ptr, routes, chunks, E,
                    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, LOG_CHUNK: tl.constexpr, E_P2: tl.constexpr,
                    ROWS: tl.constexpr):
    """Program p: route r of chunk p on expert e goes to slot padded_start[e] + (routes of e in chunks
    before p) + (routes of e before r in chunk p); the first route of each M-block names its expert."""
    pid = tl.program_id(0)
    cols = tl.arange(0, E_P2)
    total = tl.zeros([E_P2], tl.int32)
    before = tl.zeros([E_P2], tl.int32)
    own = tl.zeros([E_P2], tl.int32)
    for r0 in range(0, chunks, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        tile = tl.load(hist_ptr + rows[:, None] * E_P2 + cols[None, :],
                       mask=(rows[:, None] < chunks) & (cols[None, :] < E), other=0)
        total += tl.sum(tile, axis=0)
        before += tl.sum(tl.where(rows[:, None] < pid, tile, 0), axis=0)
        own += tl.sum(tl.where(rows[:, None] == pid, tile, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    tl.store(padded_ptr, tl.sum(padded, axis=0), mask=pid == 0)
    # sorted position i of expert e in this chunk -> slot shift[e] + i
    shift = tl.cumsum(padded, 0) - padded + before - (tl.cumsum(own, 0) - own)
    tl.store(shift_ptr + pid * E_P2 + cols, shift)
    tl.debug_barrier()
    lane = tl.arange(0, CHUNK)
    offs = pid * CHUNK + lane
    ids = tl.load(ids_ptr + offs, mask=offs < routes, other=-1)
    expert = tl.where((ids >= 0) & (ids < E), ids, E_P2).to(tl.int32)  # dropped routes sort last
    key = _sort(expert * CHUNK + lane, LOG_CHUNK)  # distinct keys: a stable, deterministic order
    expert = key // CHUNK
    used = expert < E
    slot = tl.load(shift_ptr + pid * E_P2 + expert, mask=used, other=0) + lane
    tl.store(sorted_ptr + slot, pid * CHUNK + key % CHUNK, mask=used)
    tl.store(expert_ptr + slot // BLOCK_M, expert, mask=used & (slot % BLOCK_M == 0))


CHUNK = 1024  # routes per program; benchmarks/fp4_align.py compares others


def align_routes(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, chunk: int = CHUNK) -> Alignment:
    """Sort the routes of ``topk_ids [M, top_k]`` by expert; inactive routes (id -1) and ids outside
    ``[0, num_experts)`` are dropped. Routes of one expert keep their order. ``chunk``: routes per
    program (a power of two, at least 16)."""
    if block_m < 1:
        raise ValueError(f"block_m must be positive, got {block_m}")
    if num_experts < 0:
        raise ValueError(f"num_experts must be non-negative, got {num_experts}")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids must hold integer expert ids, got {topk_ids.dtype}")
    ids = topk_ids.reshape(-1).contiguous()
    routes = ids.numel()
    slots = max_slots(routes, num_experts, block_m)
    blocks = slots // block_m
    chunks = max(1, triton.cdiv(routes, chunk))
    e_p2 = max(16, triton.next_power_of_2(num_experts))
    dev = ids.device
    sorted_ids = torch.empty(slots, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    work = torch.empty(2, chunks, e_p2, dtype=torch.int32, device=dev)  # histograms, shifts
    warps = 4 if chunk <= 1024 else 8
    # an empty tensor may carry no address: the kernels get one they never touch instead
    src, out_ids, out_experts = (t if t.numel() else work for t in (ids, sorted_ids, expert_ids))
    _chunk_histograms[(max(chunks, triton.cdiv(slots, chunk)),)](
        src, work[0], out_ids, out_experts, routes, chunks, slots, blocks, num_experts,
        CHUNK=chunk, E_P2=e_p2, BINS=triton.next_power_of_2(num_experts + 1), num_warps=warps)
    _scatter_routes[(chunks,)](
        src, work[0], work[1], out_ids, out_experts, num_padded, routes, chunks, num_experts,
        BLOCK_M=block_m, CHUNK=chunk, LOG_CHUNK=chunk.bit_length() - 1, E_P2=e_p2,
        ROWS=max(1, 8192 // e_p2), num_warps=warps)
    return Alignment(sorted_ids, expert_ids, num_padded, block_m, routes)
