"""The specs' shared reference for a routed expert GEMM: fp32 rows times dequantized expert weights.

A sweep checks thousands of candidates against the same expert weights (the tuner's weight pool
reuses them across candidates and densities), so the dequantized fp32 copy is kept with the weights
when it fits in a quarter of the device's free memory; otherwise each routed expert is dequantized
on the fly. Either way only one host sync is made (the per-expert route counts), not one per expert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

DQ_KEY = "_dequantized"  # where the fp32 copy lives in a weights dict


def _dequantized_all(weights: dict[str, Any], dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor | None:
    if DQ_KEY in weights:
        return weights[DQ_KEY]
    w, scale = weights["w"], weights["w_scale"]
    first = dequant(w[0], scale[0])
    free = torch.cuda.mem_get_info(w.device)[0] if w.is_cuda else 2 << 30
    full = None
    if w.shape[0] * first.numel() * 4 <= free // 4:
        full = torch.empty(w.shape[0], *first.shape, dtype=torch.float32, device=w.device)
        for e in range(w.shape[0]):  # one expert at a time: no whole-tensor temporaries
            full[e] = dequant(w[e], scale[e])
    weights[DQ_KEY] = full
    return full


def routed_matmul(a: torch.Tensor, ids: torch.Tensor, row_div: int, weights: dict[str, Any],
                  dequant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], n: int) -> torch.Tensor:
    """fp32 [routes, n]: route r (id ``ids[r]``, -1 = inactive -> zeros) is ``a[r // row_div] @ W[ids[r]].T``.

    ``dequant(w, scale)`` turns one expert's (or all experts') stored weights into floats."""
    ids = ids.reshape(-1).long()
    out = torch.zeros(ids.numel(), n, dtype=torch.float32, device=a.device)
    active = (ids >= 0).nonzero().squeeze(1)
    order = active[ids[active].argsort(stable=True)]
    experts, counts = torch.unique_consecutive(ids[order], return_counts=True)
    full = _dequantized_all(weights, dequant)
    a = a.float()
    start = 0
    for e, c in zip(experts.tolist(), counts.tolist(), strict=True):
        routes = order[start:start + c]
        start += c
        w = full[e] if full is not None else dequant(weights["w"][e], weights["w_scale"][e]).float()
        out[routes] = a[routes // row_div] @ w.T
    return out
