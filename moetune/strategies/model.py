"""Surrogate-guided search: a density-ratio model of "fast" configs picks what to measure next.

Three phases over the search budget:

1. warm start and exploration: the hints (best configs of neighbouring densities),
   then a seeded random sample (``EXPLORE`` of the budget);
2. the model: every measured candidate is labelled good (ok and among the fastest
   ``GOOD_QUANTILE`` of the ok ones) or bad (slower, inaccurate, failed to compile,
   crashed: those teach it where not to go). Candidates are scored by the ratio of
   kernel densities of good over bad neighbours in feature space (log2 tile sizes,
   one-hot switches): a numpy classifier of the top quantile in the spirit of TPE
   and of Helion's LFBO search. A batch is filled greedily, each pick counted as
   bad while choosing the next, so a batch spreads out instead of piling on one spot;
3. the polish (from ``POLISH`` of the budget on): best-first coordinate moves around
   the fastest configs; when those run dry the model proposes again.

Then the final interleaved re-measurement of :mod:`.adaptive`.
"""

from __future__ import annotations

import math

import numpy as np

from ..spec import Config
from .adaptive import AdaptiveStrategy, hint_indices
from .base import SearchContext

EXPLORE = 0.1
POLISH = 0.4
GOOD_QUANTILE = 0.15
BANDWIDTH = 0.3  # kernel width in feature units (one step of a 4-value tile list is 1/3)
PRIOR = 1e-3  # keeps the ratio near 1 far from every measurement
EPSILON = 0.1  # share of model picks drawn at random (keeps exploring)


class ModelGuided(AdaptiveStrategy):
    name = "model"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self._rng = np.random.default_rng(_seed(ctx))
        self._order = self._rng.permutation(len(self.space.candidates)).tolist()
        self._hints = hint_indices(self)
        self._kcols: dict[int, np.ndarray] = {}  # candidate index -> kernel column against every candidate

    # ---- the model -----------------------------------------------------------------------------------
    def _column(self, i: int) -> np.ndarray:
        col = self._kcols.get(i)
        if col is None:
            d2 = ((self.space.features - self.space.features[i]) ** 2).sum(axis=1)
            col = self._kcols[i] = np.exp(-d2 / (2 * BANDWIDTH**2)).astype(np.float32)
        return col

    def _labels(self) -> tuple[list[int], list[int]]:
        """Measured candidate indices split into good (fast, ok) and bad (the rest, failures too)."""
        times = self.times()
        measured = [self.space.index[o.key] for o in self.history if o.key in self.space.index]
        measured = list(dict.fromkeys(measured))
        if not times:
            return [], measured
        ranked = sorted(times, key=times.get)
        good = set(ranked[:max(1, math.ceil(GOOD_QUANTILE * len(ranked)))])
        return sorted(good), [i for i in measured if i not in good]

    def _model_picks(self, k: int) -> list[int]:
        good, bad = self._labels()
        if not good:
            return self.unmeasured(self._order)[:k]
        n = len(self.space.candidates)
        lg = sum((self._column(i) for i in good), np.zeros(n)) / len(good)
        bsum = sum((self._column(i) for i in bad), np.zeros(n))
        nb = len(bad)
        open_ = np.array([key not in self._seen for key in self.space.keys])
        picks: list[int] = []
        for _ in range(k):
            if not open_.any():
                break
            if self._rng.random() < EPSILON:
                j = int(self._rng.choice(np.flatnonzero(open_)))
            else:
                score = (lg + PRIOR) / (bsum / max(nb, 1) + PRIOR)
                j = int(np.argmax(np.where(open_, score, -np.inf)))
            picks.append(j)
            open_[j] = False
            bsum = bsum + self._column(j)  # a pending pick counts as bad: the batch spreads out
            nb += 1
        return picks

    # ---- proposals -----------------------------------------------------------------------------------
    def propose(self, n: int) -> list[Config]:
        left = self.budget_left()
        if left <= 0:
            return []
        total = self.search_budget()
        used = total - left
        k = min(n, max(1, total // 10))  # batches no larger than a tenth of the budget: the model learns
        hints = self.unmeasured(self._hints)
        if hints:
            return self.take(hints, k)
        if used < EXPLORE * total:
            return self.take(self.unmeasured(self._order), min(k, math.ceil(EXPLORE * total) - used))
        if used >= POLISH * total:
            moves = self.local_moves()
            if moves:
                return self.take(moves, k)
        return self.take(self._model_picks(k), k)


def _seed(ctx: SearchContext) -> int:
    import zlib

    return zlib.crc32(f"{ctx.seed}:model:{ctx.problem.describe()}".encode())
