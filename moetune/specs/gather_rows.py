"""Spec of ``gather_rows``: copy routed quantized rows and their scales in one launch.

The op has no weights, so its shape describes the activation: ``K`` is the row
width in bytes (the model's hidden size), ``N`` must equal ``K`` (kept only
because every shape carries it; filled in when omitted), and ``E``/``top_k``
are there so a table is keyed by density (rows per expert) like the GEMMs it
feeds. ``routes`` is the number of rows gathered: tokens * top_k * active fraction.
"""

from __future__ import annotations

from typing import Any

import torch

from moetune.kernels.gather_rows.config import GatherRowsRules, group_count, shape
from moetune.models import ModelPreset
from moetune.problem import Config, Problem
from moetune.specs.base import Inputs, KernelSpec


def sorted_dst2src(topk_ids: torch.Tensor) -> torch.Tensor:
    """The gather map a grouped GEMM wants: for each active route, sorted by expert, its token.

    A token appears once per expert it routes to; inactive slots (id -1) are skipped.
    """
    flat = topk_ids.reshape(-1).long()
    token = torch.arange(topk_ids.numel(), device=topk_ids.device) // topk_ids.shape[1]
    active = flat >= 0
    order = torch.sort(flat[active], stable=True).indices
    return token[active][order].to(torch.int32)


class GatherRowsSpec(GatherRowsRules, KernelSpec):
    exact = True
    cuda_graph = True

    def shape_from_model(self, model: ModelPreset, tp: int = 1, ep: int = 1) -> dict[str, Any]:
        experts, _ = model.per_rank(tp, ep)
        return shape(experts, model.hidden, model.top_k)

    # ---- running -----------------------------------------------------------------------
    def make_inputs(self, problem: Problem, device: str, seed: int) -> Inputs:
        from moetune.routing import make_routes

        shape = problem.shape
        k, g = shape["K"], group_count(shape["K"])
        gen = torch.Generator(device=device).manual_seed(seed)
        ids, _ = make_routes(problem.tokens, shape["top_k"], shape["E"], routing=problem.routing,
                             active_fraction=problem.active_fraction, generator=gen, device=device,
                             typical=True)
        dst2src = sorted_dst2src(ids)
        # Random bytes, NaN and inf patterns included: the copy must not care what they encode.
        q = torch.randint(0, 256, (problem.tokens, k), generator=gen, dtype=torch.uint8, device=device)
        scales = torch.rand(problem.tokens, g, generator=gen, device=device) + 0.5
        rows = dst2src.numel()
        tensors = {"q": q.view(torch.float8_e4m3fn), "scales": scales, "dst2src": dst2src}
        outputs = (torch.empty(rows, k, dtype=torch.float8_e4m3fn, device=device),
                   torch.empty(rows, g, dtype=torch.float32, device=device))
        return Inputs(tensors, outputs)

    def run(self, inputs: Inputs, config: Config) -> None:
        from moetune.kernels.gather_rows.gather import gather_rows_with_scales

        t = inputs.tensors
        gather_rows_with_scales(t["q"], t["scales"], t["dst2src"], config=config, out=inputs.outputs)

    def reference(self, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        from moetune.kernels.gather_rows.gather import gather_rows_with_scales_reference

        t = inputs.tensors
        return gather_rows_with_scales_reference(t["q"], t["scales"], t["dst2src"])

    # ---- roofline ------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem, inputs: Inputs | None = None) -> int:
        """Distinct source rows read once, every gathered row written, the map read once."""
        k = problem.shape["K"]
        row_bytes = k + 4 * group_count(k)
        if inputs is not None:
            idx = inputs.tensors["dst2src"]
            rows, distinct, idx_bytes = idx.numel(), int(torch.unique(idx).numel()), idx.element_size()
        else:
            rows, idx_bytes = problem.routes, 4
            # Every token keeps round(top_k * active_fraction) slots, so each is read if any is active.
            distinct = problem.tokens if rows else 0
        return distinct * row_bytes + rows * (row_bytes + idx_bytes)

    def flops(self, problem: Problem, inputs: Inputs | None = None) -> int:
        return 0


SPEC = GatherRowsSpec()
SPECS = (SPEC,)

