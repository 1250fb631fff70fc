"""Shared machinery of the budgeted, adaptive strategies: budget, local moves, the final re-measurement.

Budget. ``ctx.budget`` counts every measurement at the point (the stored default
included). With no budget an adaptive strategy takes a tenth of the candidates
(at least ``MIN_BUDGET``) instead of walking the whole space. ``ctx.plan``: the
budget its phases are laid out over where the driver stops it at ``ctx.budget``
first and sets a budget anew later (a grid budget's first pass).

Final re-measurement. A single noisy measurement flatters a lucky candidate, so
before declaring a winner the top ``FINALISTS`` ok candidates are measured again,
interleaved (A B C A B C) so drift hits them alike; the winner is the config with
the lowest mean time over all of its measurements. The first warm start (a sweep's
heuristic) is measured again too when it is not a finalist: it is measured
first, while the compile workers build the point's inputs on the same GPU (which
can read it slow: docs/tuner.md, "Final re-measurement"), and
``moetune export`` keeps the lower of two readings. Those measurements come out of the
budget (reserved up front), but they are *re*-measurements of stored configs,
so they are never proposed through :meth:`propose` (which must only return
unmeasured candidates, the resume rule). A driver runs the protocol after
``propose`` has returned ``[]``::

    configs = strategy.remeasure()           # may be []; same config several times, interleaved
    strategy.observe_remeasured(results)     # Observations in the same order
    winner = strategy.winner()

Replay runs it. A live sweep stores those rows with strategy tag ``"remeasure"``:
resume skips by config, and a config that already has a row is not a new candidate,
so "nothing measured twice" still holds for candidates; the extra rows only refine
times. A driver that skips the protocol simply gets :meth:`winner` = best measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from moetune.problem import Config, canonical_json
from moetune.tuner.strategies.base import Observation, SearchContext, Strategy
from moetune.tuner.strategies.features import Space

MIN_BUDGET = 30
DEFAULT_FRACTION = 0.1
FINALISTS = 3
FINAL_SHARE = 0.08  # of the budget, at most, for the re-measurement (whole rounds of FINALISTS)
MAX_ROUNDS = 2
RECHECK = 1  # warm starts (first hints) measured again at the end, finalist or not


class AdaptiveStrategy(Strategy):
    """Base of strategies that choose each batch from what they measured so far."""

    # a sweep's default grid budget, as a share of all its points' candidates; None: the sum of the
    # per-point defaults (``planned``)
    grid_share: float | None = None

    @classmethod
    def planned(cls, candidates: int, budget: int | None) -> int:
        total = budget if budget is not None else max(MIN_BUDGET, math.ceil(DEFAULT_FRACTION * candidates))
        return min(total, candidates + 1)

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self.space = Space(ctx.candidates, ctx.keys)
        self._recheck = hint_indices(self)[:RECHECK]
        self._plan_budget()
        self.finals: list[Observation] = []
        self._expanded: set[int] = set()

    def set_budget(self, budget: int) -> None:
        super().set_budget(budget)
        self._plan_budget()

    def _plan_budget(self) -> None:
        """The point's total, the share of it reserved for the final re-measurement, and the total the
        search's phases are laid out over (``ctx.plan``, where the driver stops the search early)."""
        assert self.ctx is not None
        n = len(self.ctx.candidates)
        self.total = self.planned(n, self.ctx.budget)
        self.rounds = _rounds(self.total)
        self.reserve = self.rounds * FINALISTS + len(self._recheck)
        span = self.total if self.ctx.plan is None else max(self.total, self.planned(n, self.ctx.plan))
        self.span = span - _rounds(span) * FINALISTS - len(self._recheck)  # as a search of that budget

    # ---- budget ---------------------------------------------------------------------------------
    def budget_left(self) -> int:
        return max(0, self.total - self.reserve - len(self._seen))

    def search_budget(self) -> int:
        """Measurements the search lays its phases out over at this point (before the re-measurement)."""
        return max(1, self.span)

    # ---- what is known ----------------------------------------------------------------------------
    def times(self) -> dict[int, float]:
        """Candidate index -> measured time of every ok candidate in this point's list."""
        out: dict[int, float] = {}
        for o in self.history:
            i = self.space.index.get(o.key)
            if i is not None and o.ok:
                out[i] = o.time_ms
        return out

    def unmeasured(self, idx: Sequence[int]) -> list[int]:
        return [i for i in idx if self.space.keys[i] not in self._seen]

    def take(self, idx: Sequence[int], n: int) -> list[Config]:
        return self.fresh([self.space.candidates[i] for i in idx], n)

    def local_moves(self, limit: int = 1) -> list[int]:
        """Best-first local search: the unmeasured one-step neighbours of the fastest ok candidates
        whose neighbourhoods are not yet fully measured, as many neighbourhoods as it takes to reach
        ``limit`` moves (whole neighbourhoods; 1: the fastest one's only)."""
        out: dict[int, None] = {}
        for i, _ in sorted(self.times().items(), key=lambda kv: kv[1]):
            if i in self._expanded:
                continue
            todo = self.unmeasured(self.space.neighbours(i))
            if not todo:
                self._expanded.add(i)
                continue
            out.update(dict.fromkeys(todo))
            if len(out) >= limit:
                break
        return list(out)

    # ---- final re-measurement ----------------------------------------------------------------------
    def remeasure(self) -> list[Config]:
        """The first warm start (unless a finalist), then the top candidates interleaved: a final
        re-measurement within the reserved budget."""
        times = self.times()
        top = [i for i, _ in sorted(times.items(), key=lambda kv: kv[1])[:FINALISTS]]
        extra = [i for i in self._recheck if i in times and i not in top]
        spare = self.total - len(self._seen) - len(extra)
        rounds = min(self.rounds, spare // len(top)) if self.rounds and len(top) >= 2 else 0
        return [self.space.candidates[i] for i in extra + top * rounds]

    def observe_remeasured(self, results: Sequence[Observation]) -> None:
        self.finals.extend(results)

    def winner(self) -> Observation | None:
        """The lowest mean time over all of a config's ok measurements (finalists and re-checked warm
        starts have several, the rest one; the best measured one without finals)."""
        readings: dict[str, list[float]] = {}
        for o in [*self.history, *self.finals]:
            if o.ok:
                readings.setdefault(o.key, []).append(o.time_ms)
        if not readings:
            return self.best()
        mean = {k: sum(ts) / len(ts) for k, ts in readings.items()}
        key = min(mean, key=lambda k: (mean[k], k))
        first = next(o for o in self.history if o.key == key)
        return Observation(first.config, "ok", mean[key], first.spread, first.error)


def _rounds(total: int) -> int:
    """Rounds of the final re-measurement a point's total affords."""
    return min(MAX_ROUNDS, int(FINAL_SHARE * total) // FINALISTS)


def hint_indices(strategy: AdaptiveStrategy) -> list[int]:
    """Hints (best configs of neighbouring densities) that are candidates here, in order."""
    assert strategy.ctx is not None
    out = []
    for h in strategy.ctx.hints:
        i = strategy.space.index.get(canonical_json(h))
        if i is not None and i not in out:
            out.append(i)
    return out
