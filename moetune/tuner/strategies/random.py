"""Random search: candidates in a seeded random order, up to the budget.

The order depends only on the seed and the problem, so a resumed sweep walks the
same sequence and skips what it already measured.
"""

from __future__ import annotations

import random

from moetune.tuner.strategies.base import FixedOrder, SearchContext


class RandomSearch(FixedOrder):
    name = "random"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        rng = random.Random(f"{ctx.seed}:{ctx.problem.describe()}")
        order = list(range(len(ctx.candidates)))
        rng.shuffle(order)
        self.set_order([ctx.candidates[i] for i in order],
                       [ctx.keys[i] for i in order] if ctx.keys is not None else None)
