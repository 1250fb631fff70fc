"""Exhaustive search: every constrained candidate, in space order (the reference for other strategies),
after the warm starts among them: the heuristic's config, the best at neighbouring densities. Measured
first, they set the point's best early, and the runner's timing is cut short for every candidate far
slower than it (most of a full space)."""

from __future__ import annotations

from ..spec import Config, canonical_json
from .base import SearchContext, Strategy


class Exhaustive(Strategy):
    name = "exhaustive"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        keys = set(ctx.keys) if ctx.keys is not None else {canonical_json(c) for c in ctx.candidates}
        self._order = [h for h in ctx.hints if canonical_json(h) in keys] + ctx.candidates

    def propose(self, n: int) -> list[Config]:
        assert self.ctx is not None, "start() first"
        return self.fresh(self._order, n)
