"""Random search: candidates in a seeded random order, up to the budget.

The order depends only on the seed and the problem, so a resumed sweep walks the
same sequence and skips what it already measured.
"""

from __future__ import annotations

import random

from ..spec import Config
from .base import SearchContext, Strategy


class RandomSearch(Strategy):
    name = "random"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        rng = random.Random(f"{ctx.seed}:{ctx.problem.describe()}")
        self._order = list(ctx.candidates)
        rng.shuffle(self._order)

    def propose(self, n: int) -> list[Config]:
        return self.fresh(self._order, n)
