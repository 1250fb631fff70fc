"""The specs' shared reference for a routed expert GEMM: fp32 rows times dequantized expert weights.

A sweep checks thousands of candidates against the same expert weights (the tuner's weight pool
reuses them across candidates and densities), so the dequantized fp32 copy is kept with the weights
when it fits in a quarter of the device's free memory; otherwise the routed experts are dequantized
on the fly, a chunk of experts per call. Either way the host waits on the device once for the
per-expert route counts, and once per chunk of few-row experts for their row indices, never per expert.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

DQ_KEY = "_dequantized"  # where the fp32 copy lives in a weights dict
CHUNK_BYTES = 1 << 30  # fp32 experts dequantized by one call (a few launches per chunk, not per expert)
# Rows at which an expert gets a matmul of its own. Below, its padded share of a batched matmul is bound by
# reading its weights (a few flops per fp32 weight byte), so the padding costs nothing.
SMALL = 16


def _blocks(weights: dict[str, Any], dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            experts: list[int], full: torch.Tensor | None) -> Iterator[tuple[list[int], torch.Tensor]]:
    """(experts, their fp32 weights [c, n, k]) for ``experts``, at most :data:`CHUNK_BYTES` at a time:
    copied out of the cached ``full`` copy, or dequantized (one call per chunk)."""
    w, scale = weights["w"], weights["w_scale"]
    per_expert = 4 * w[0].numel() * (2 if w.dtype == torch.uint8 else 1)  # packed fp4: two values a byte
    group = max(1, CHUNK_BYTES // per_expert)
    for i in range(0, len(experts), group):
        sel = experts[i:i + group]
        idx = torch.tensor(sel, device=w.device)
        if full is not None:
            yield sel, full.index_select(0, idx)
        else:
            yield sel, dequant(w.index_select(0, idx), scale.index_select(0, idx)).float()


def _dequantized_all(weights: dict[str, Any], dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor | None:
    if DQ_KEY in weights:
        return weights[DQ_KEY]
    w = weights["w"]
    first = dequant(w[:1], weights["w_scale"][:1])[0]
    free = 2 << 30
    if w.is_cuda:  # memory this process's allocator holds unused is free for it too
        free = (torch.cuda.mem_get_info(w.device)[0] + torch.cuda.memory_reserved(w.device)
                - torch.cuda.memory_allocated(w.device))
    full = None
    if w.shape[0] * first.numel() * 4 <= free // 4:
        full = torch.empty(w.shape[0], *first.shape, dtype=torch.float32, device=w.device)
        for sel, block in _blocks(weights, dequant, list(range(w.shape[0])), None):
            full[sel[0]:sel[-1] + 1] = block
    weights[DQ_KEY] = full
    return full


def routed_matmul(a: torch.Tensor, ids: torch.Tensor, row_div: int, weights: dict[str, Any],
                  dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], n: int, *,
                  tf32_exact: bool = False) -> torch.Tensor:
    """fp32 [routes, n]: route r (id ``ids[r]``, -1 = inactive -> zeros) is ``a[r // row_div] @ W[ids[r]].T``.

    ``dequant(w, scale)`` turns one expert's (or all experts') stored weights into floats. Rows are
    gathered once in expert order. An expert with more than :data:`SMALL` rows gets one matmul of its
    own; the others (decode: one to a few rows each) share one batched matmul per chunk of experts, their
    rows zero-padded to the chunk's largest count: a sweep checks every candidate, and one launch per
    expert (hundreds at a decode point) cost more than the products.
    ``tf32_exact``: the caller's ``a`` and weights are exact in TF32 (at most 10 mantissa bits: fp8 or
    fp4 codes times powers of two), so CUDA matmuls may take TF32 inputs with fp32 accumulation and give
    the fp32 products, several times faster."""
    ids = ids.reshape(-1).long()
    out = torch.zeros(ids.numel(), n, dtype=torch.float32, device=a.device)
    active = (ids >= 0).nonzero().squeeze(1)
    order = active[ids[active].argsort(stable=True)]
    experts, counts = torch.unique_consecutive(ids[order], return_counts=True)
    experts, counts = experts.tolist(), counts.tolist()
    full = _dequantized_all(weights, dequant)
    rows = a.float().index_select(0, order // row_div)
    sorted_out = torch.empty(order.numel(), n, dtype=torch.float32, device=a.device)
    starts = list(itertools.accumulate([0] + counts))
    by_expert = dict(zip(experts, range(len(experts)), strict=True))
    big = [e for e, c in zip(experts, counts, strict=True) if c > SMALL]
    small = [e for e, c in zip(experts, counts, strict=True) if c <= SMALL]
    with _tf32(tf32_exact and a.is_cuda):
        if full is not None:  # cached: a view of the expert, no copy
            each = ((e, full[e]) for e in big)
        else:
            chunks = _blocks(weights, dequant, big, None)
            each = (pair for sel, block in chunks for pair in zip(sel, block, strict=True))
        for e, w in each:
            lo, hi = starts[by_expert[e]], starts[by_expert[e] + 1]
            torch.mm(rows[lo:hi], w.T, out=sorted_out[lo:hi])
        for sel, block in _blocks(weights, dequant, small, full) if small else ():
            groups = [by_expert[e] for e in sel]
            cnt = torch.tensor([counts[g] for g in groups])
            batch = torch.repeat_interleave(torch.arange(len(groups)), cnt)
            slot = torch.arange(int(cnt.sum())) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt)
            at = torch.repeat_interleave(torch.tensor([starts[g] for g in groups]), cnt) + slot
            batch, slot, at = torch.stack([batch, slot, at]).to(a.device)  # one copy to the device
            padded = rows.new_zeros(len(groups), int(cnt.max()), rows.shape[1])
            padded[batch, slot] = rows[at]
            sorted_out[at] = torch.bmm(padded, block.transpose(1, 2))[batch, slot]
    out[order] = sorted_out
    return out


@contextlib.contextmanager
def _tf32(on: bool) -> Iterator[None]:
    """CUDA fp32 matmuls with TF32 inputs inside, torch's setting restored after."""
    if not on:
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = before
