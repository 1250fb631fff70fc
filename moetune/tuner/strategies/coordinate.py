"""Coordinate descent: from a start config, move one parameter one step at a time while it pays.

Start configs, in order: the best configs of neighbouring densities (warm start,
``ctx.hints``), then the best already measured here (the shipped default, which
the sweep measures first). From the current config every one-step neighbour is
measured (one parameter moved to the next or previous value of its list, pruned
values skipped; every other value for a categorical one) as one batch, and the
search moves to the fastest neighbour if it beats the current one by more than
the noise. When none does, it restarts from a random unmeasured candidate (in
replays, restarting near the best found stays in the same trap), until
the budget is spent. Each batch is a whole neighbourhood, so the path does not
depend on the batch size.
"""

from __future__ import annotations

import random

from moetune.problem import Config
from moetune.tuner.strategies.adaptive import AdaptiveStrategy, hint_indices
from moetune.tuner.strategies.base import SearchContext

MIN_GAIN = 0.003  # relative improvement that always counts as real
NOISE_SHARE = 0.5  # of the recorded spread (p80-p20 over median) that a gain must beat


def better(new: float, new_spread: float | None, old: float, old_spread: float | None) -> bool:
    """``new`` beats ``old`` by more than the noise of either measurement."""
    noise = max(MIN_GAIN, NOISE_SHARE * max(new_spread or 0.0, old_spread or 0.0))
    return new < old * (1.0 - noise)


class CoordinateDescent(AdaptiveStrategy):
    name = "coordinate"

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self._rng = random.Random(f"{ctx.seed}:{self.name}:{ctx.problem.describe()}")
        self._starts = hint_indices(self)
        best = self.best()
        if best is not None and best.key in self.space.index:
            self._starts.append(self.space.index[best.key])
        self._current: int | None = None

    def _spread(self, i: int) -> float | None:
        key = self.space.keys[i]
        return next((o.spread for o in reversed(self.history) if o.key == key), None)

    def _next_start(self) -> int | None:
        while self._starts:
            i = self._starts.pop(0)
            if i not in self._expanded:
                return i
        todo = self.unmeasured(range(len(self.space.candidates)))
        return self._rng.choice(todo) if todo else None

    def propose(self, n: int) -> list[Config]:
        while self.budget_left() > 0:
            if self._current is None:
                self._current = self._next_start()
                if self._current is None:
                    return []
            cur = self._current
            times = self.times()
            if cur not in times:
                if self.space.keys[cur] in self._seen:  # measured and failed, or skipped
                    self._expanded.add(cur)
                    self._current = None
                    continue
                return self.take([cur], n)
            todo = self.unmeasured(self.space.neighbours(cur))
            if todo:
                return self.take(todo, n)
            self._expanded.add(cur)
            nbrs = [j for j in self.space.neighbours(cur) if j in times]
            step = min(nbrs, key=times.get, default=None)
            if step is not None and better(times[step], self._spread(step), times[cur], self._spread(cur)):
                self._current = step
            else:
                self._current = None  # converged: restart
        return []

    def upcoming(self, n: int) -> list[Config]:
        """The current config's unmeasured neighbours, then those of its fastest measured neighbours
        (where the descent steps next)."""
        if self._current is None or self.budget_left() <= 0:
            return []
        times = self.times()
        cur = self._current
        steps = sorted((j for j in self.space.neighbours(cur) if j in times), key=times.get)
        guess = [i for j in [cur, *steps] for i in self.unmeasured(self.space.neighbours(j))]
        return [self.space.candidates[i] for i in dict.fromkeys(guess)][:n]
