"""A budget for a whole grid of points, spent in two passes where the points disagree.

The points of one sweep rarely need the same effort. Where a point's prior is confident and its
neighbouring densities agree on the winner, a few measurements confirm it; where they disagree (a
boundary between two designs, a prior that is wrong there), its search is not done. So a grid budget
(``moetune sweep --grid-budget``; ``moetune replay --grid-budget``) is spent in two passes:

1. **First pass** (:func:`first_pass`): every point gets ``FIRST_SHARE`` of its candidates, at least
   ``FIRST_MIN`` measurements, never more than its even share of the grid budget. Its search lays out
   its phases over that even share (``SearchContext.plan``) and is stopped at the first-pass budget,
   so a first pass is the start of the search a flat budget would make.
2. **Second pass** (:func:`allocate`): the rest of the grid budget goes to the points that
   :func:`disagreements` flags, in proportion to their candidates; the others get nothing more. Each
   point's search goes on from where its first pass left it (the same strategy, its budget set anew:
   :meth:`~moetune.tuner.strategies.base.Strategy.set_budget`).

Every point's final re-measurement comes after its second pass, within its budget. A grid budget counts
measurements as a per-point budget does (the default and the final re-measurements included); the
measurements a point already has (a resumed sweep) count against its share.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune.problem import Problem

FIRST_SHARE = 0.02  # of each point's candidates, in the first pass
FIRST_MIN = 8  # measurements at least in the first pass: the default, warm starts and a few picks
TIE = 0.01  # a neighbour's best that reads within this of the point's best agrees with it
CLOSE = 0.03  # another design's config this close to the point's best: the point sits at a boundary
PRIOR_TOP = 10  # the prior's first picks; a best outside them says the prior is wrong here

# why a point gets more (see disagreements)
NEIGHBOURS, BOUNDARY, PRIOR, DESIGN = "neighbours", "boundary", "prior", "design"


@dataclass(frozen=True)
class GridBudget:
    """Measurements for a whole grid: ``count``, or ``share`` of all its points' candidates, or (neither)
    what the strategy's per-point defaults add up to."""

    count: int | None = None
    share: float | None = None

    @classmethod
    def parse(cls, value: str | int, option: str = "--grid-budget") -> GridBudget:
        """``"5%"`` (of the grid's candidates) or ``"4000"`` (measurements); ValueError naming ``option``
        otherwise."""
        text = str(value).strip()
        try:
            number = float(text[:-1]) if text.endswith("%") else int(text)
        except ValueError:
            raise ValueError(f"{option}: {text!r} is neither a count nor a percentage") from None
        if number <= 0:
            raise ValueError(f"{option}: {text!r} must be positive")
        return cls(share=number / 100) if text.endswith("%") else cls(count=int(number))

    def total(self, sizes: Sequence[int], default: Any = None) -> int:
        """The grid's measurements; ``sizes``: each point's candidates. ``default``: the strategy class,
        whose :meth:`~moetune.tuner.strategies.base.Strategy.planned` per-point default is summed when
        neither a count nor a share is given. ValueError below one measurement per point."""
        if self.count is not None:
            total = self.count
        elif self.share is not None:
            total = math.ceil(self.share * sum(sizes))
        else:
            total = sum(default.planned(n, None) for n in sizes)
        if total < len(sizes):
            raise ValueError(f"--grid-budget: {total} measurement(s) for {len(sizes)} points; a point "
                             "needs at least one (its default)")
        return total

    def describe(self) -> str:
        if self.count is not None:
            return f"{self.count} measurements"
        if self.share is not None:
            return f"{100 * self.share:g}% of the candidates"
        return "the per-point defaults' sum"


def first_pass(sizes: Sequence[int], total: int) -> list[int]:
    """Each point's first-pass budget: ``FIRST_SHARE`` of its candidates, at least ``FIRST_MIN``, at
    most its candidates and the default (``size + 1``) and its even share of ``total`` (so the first pass
    never spends more than the grid has), at least one."""
    return [max(1, min(size + 1, max(FIRST_MIN, math.ceil(FIRST_SHARE * size)), even))
            for size, even in zip(sizes, even_shares(sizes, total), strict=True)]


def even_shares(sizes: Sequence[int], total: int) -> list[int]:
    """``total`` shared in proportion to the points' candidates: what a flat budget of the same total
    gives each point, and what its first-pass search plans for."""
    grid = sum(sizes)
    return [max(1, total * size // grid) for size in sizes]


@dataclass(frozen=True)
class Reading:
    """One point after its first pass, as the allocation sees it."""

    series: Hashable  # points of one op, shape and routing: their neighbours lie along density
    density: float
    times: Mapping[str, float]  # every ok config measured here: its fastest reading
    designs: Mapping[str, str]  # the design of each config in ``times`` (KernelSpec.design)
    prior_top: Sequence[str] | None  # the prior's first picks here; None where the search has no prior
    used: int  # measurements counted against the point so far (at least its first-pass budget)
    room: int  # most measurements the point can take: its candidates and the default

    @property
    def best(self) -> str | None:
        return min(self.times, key=lambda k: (self.times[k], k)) if self.times else None


def reading(problem: Problem, strategy: Any, spec: Any, first: int, room: int) -> Reading:
    """The :class:`Reading` of ``strategy`` after its first pass at ``problem``; ``spec`` names each
    config's design (None: one design)."""
    times: dict[str, float] = {}
    configs: dict[str, Any] = {}
    for o in strategy.history:
        if o.ok and o.time_ms < times.get(o.key, math.inf):
            times[o.key], configs[o.key] = o.time_ms, o.config
    designs = {k: spec.design(c) if spec is not None else "" for k, c in configs.items()}
    used = max(first, len({o.key for o in strategy.history}))
    return Reading((problem.kernel, problem.shape_key, problem.routing), problem.density, times, designs,
                   strategy.first_choices(PRIOR_TOP), used, room)


def _agrees(a: Reading, b: Reading) -> bool:
    """Two points can share one config: they have one best, or either's best was measured at the other
    within ``TIE`` of the other's best."""
    def serves(config: str, at: Reading) -> bool:
        return at.times.get(config, math.inf) <= (1 + TIE) * at.times[at.best]

    if a.best is None or b.best is None:
        return False
    return a.best == b.best or serves(b.best, a) or serves(a.best, b)


def _design(r: Reading) -> str | None:
    return None if r.best is None else r.designs[r.best]


def disagreements(readings: Sequence[Reading]) -> list[tuple[str, ...]]:
    """Why each point should get more (empty: it agrees). A point is flagged

    - ``NEIGHBOURS`` when it agrees (:func:`_agrees`) with no point at the nearest lower density nor at
      the nearest higher one of its series (at an end of the series, the one side it has; a point alone
      in its series has nothing to agree with);
    - ``BOUNDARY`` when the bests on its two sides are of different designs: the design changes across
      it, so its search may have followed one side's warm starts into the wrong design;
    - ``PRIOR`` when its best is not among its prior's ``PRIOR_TOP`` first picks;
    - ``DESIGN`` when a config of another design than its best's reads within ``CLOSE`` of the best.

    A point with no ok reading is flagged ``NEIGHBOURS`` (its search found nothing yet)."""
    series: dict[Hashable, list[int]] = {}
    for i, r in enumerate(readings):
        series.setdefault(r.series, []).append(i)
    out = []
    for i, r in enumerate(readings):
        why = []
        others = [readings[j] for j in series[r.series] if j != i and readings[j].density != r.density]
        below = [o for o in others if o.density < r.density]
        above = [o for o in others if o.density > r.density]
        sides = [[o for o in side if o.density == edge] for side, edge in
                 ((below, max((o.density for o in below), default=None)),
                  (above, min((o.density for o in above), default=None))) if side]
        if not any(_agrees(r, o) for side in sides for o in side):
            why.append(NEIGHBOURS)
        designs = [{_design(o) for o in side} - {None} for side in sides]
        if len(designs) == 2 and all(designs) and not designs[0] & designs[1]:
            why.append(BOUNDARY)
        best = r.best
        if best is not None and r.prior_top and best not in r.prior_top:
            why.append(PRIOR)
        if best is not None and any(r.designs[k] != r.designs[best] and t <= (1 + CLOSE) * r.times[best]
                                    for k, t in r.times.items()):
            why.append(DESIGN)
        out.append(tuple(why))
    return out


def allocate(readings: Sequence[Reading], pool: int, why: Sequence[tuple[str, ...]] | None = None
             ) -> list[int]:
    """Extra measurements per point for the second pass: ``pool`` shared among the flagged points
    (``why``: :func:`disagreements`, computed when not given) in proportion to their room (the same share
    of each one's space), none past a point's room, nothing for the points that agree; what no flagged
    point has room for is left unspent."""
    flagged = [i for i, because in enumerate(why if why is not None else disagreements(readings)) if because]
    extra = [0] * len(readings)
    left = max(0, pool)
    while left > 0:
        open_ = [i for i in flagged if readings[i].used + extra[i] < readings[i].room]
        if not open_:
            break
        weight = sum(readings[i].room for i in open_)
        given = 0
        for i in open_:  # floors first; the ones left over go one each, largest room first
            take = min(readings[i].room - readings[i].used - extra[i], left * readings[i].room // weight)
            extra[i] += take
            given += take
        if given == 0:
            for i in sorted(open_, key=lambda i: -readings[i].room)[:left]:
                extra[i] += 1
                given += 1
        left -= given
    return extra


def second_pass(readings: Sequence[Reading], total: int) -> tuple[list[int], list[tuple[str, ...]]]:
    """Each point's extra measurements and why it gets them: what ``total`` leaves once every point's
    ``used`` is counted, to the points that disagree."""
    why = disagreements(readings)
    return allocate(readings, total - sum(r.used for r in readings), why), why


# ---- a sweep's points (moetune.tuner.sweep.Point: budget, extra, why) ------------------------------------
def share_first_pass(points: Sequence[Any], grid: GridBudget, strategy: Any) -> int:
    """Set each point's ``budget`` to its first-pass share of ``grid`` and its ``plan`` to its even share;
    the grid's total (``strategy``: the strategy class, for the default total)."""
    sizes = [len(pt.candidates) for pt in points]
    total = grid.total(sizes, strategy)
    for pt, share, even in zip(points, first_pass(sizes, total), even_shares(sizes, total), strict=True):
        pt.budget, pt.plan, pt.extra, pt.why = share, even, 0, ()
    return total


def share_second_pass(points: Sequence[Any], searches: Mapping[int, Any], total: int) -> int:
    """Raise the budgets of the points (by index) whose first passes disagree, and their searches'
    (``searches``: each point's strategy after its first pass); the extra measurements given. A point with
    no search (its spec failed there) keeps its first-pass share out of the total."""
    live = [i for i in sorted(searches) if not points[i].failure]
    spent = sum(pt.budget for i, pt in enumerate(points) if i not in live)
    readings = [reading(points[i].problem, searches[i], points[i].spec, points[i].budget,
                        len(points[i].candidates) + 1) for i in live]
    extra, why = second_pass(readings, total - spent)
    for i, r, more, because in zip(live, readings, extra, why, strict=True):
        pt = points[i]
        pt.budget, pt.plan, pt.extra, pt.why = r.used + more, None, more, because
        searches[i].set_budget(pt.budget)
    return sum(extra)
