"""Exhaustive search: every constrained candidate, in space order (the reference for other strategies),
after the warm starts among them: the heuristic's config, the best at neighbouring densities. Measured
first, they set the point's best early, and the runner's timing is cut short for every candidate far
slower than it (most of a full space)."""

from __future__ import annotations

from moetune.problem import canonical_json
from moetune.tuner.strategies.base import FixedOrder, SearchContext


class Exhaustive(FixedOrder):
    name = "exhaustive"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        keys = ctx.keys if ctx.keys is not None else [canonical_json(c) for c in ctx.candidates]
        known = set(keys)
        hints = [(h, k) for h in ctx.hints if (k := canonical_json(h)) in known]
        self.set_order([h for h, _ in hints] + list(ctx.candidates), [k for _, k in hints] + list(keys))
