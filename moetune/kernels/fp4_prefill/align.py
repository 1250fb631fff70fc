"""Route alignment for grouped GEMMs: sort routes by expert, pad each expert to whole M-blocks.

Everything is sized from the worst case (``routes + E * (block_m - 1)`` slots), so
nothing here reads a count back to the host: the path stays CUDA-graph capturable
and the GEMM's programs past the padded count exit early.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def align_routes(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the routes of ``topk_ids [M, top_k]`` by expert; inactive routes (id -1) are dropped."""
    if block_m < 1:
        raise ValueError(f"block_m must be positive, got {block_m}")
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
    start = torch.cat((pad_start, pad_start.new_full((1,), slots)))  # dump bin -> slot `slots` (no host copy)
    dest = torch.where(sorted_key < num_experts, start[sorted_key] + rank, slots)
    sorted_ids = torch.full((slots + 1,), routes, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    blocks = slots // block_m
    block_start = torch.arange(blocks, device=dev) * block_m
    expert = torch.searchsorted(pad_end, block_start, right=True)
    total = pad_end[-1:] if num_experts else torch.zeros(1, dtype=torch.long, device=dev)
    expert = torch.where(block_start < total, expert, torch.full_like(expert, -1))
    return Alignment(sorted_ids[:slots], expert.to(torch.int32), total.to(torch.int32), block_m, routes)
