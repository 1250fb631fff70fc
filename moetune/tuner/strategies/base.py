"""The strategy interface: a strategy proposes candidates in batches and learns from their results.

The sweep hands a strategy one :class:`SearchContext` per problem: the candidates
that passed the spec's constraints (full configs, in space order), what the store
already holds for this point (resume, and the shipped default measured first),
hints such as the best configs at neighbouring densities (warm starts), a budget
and a seed. The strategy then alternates ``propose(n)`` (up to ``n`` configs to
measure next; several GPUs can measure one batch at once) and ``observe(results)``.
It must never propose a candidate outside the context's list or one already
measured; :meth:`Strategy.fresh` filters for that. An empty proposal ends the search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec


@dataclass(frozen=True)
class Observation:
    """One measured candidate as strategies see it (a store row, reduced)."""

    config: Config
    status: str
    time_ms: float | None = None
    spread: float | None = None
    error: float | None = None

    @property
    def key(self) -> str:
        return canonical_json(self.config)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time_ms is not None and math.isfinite(self.time_ms)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Observation:
        import json

        def num(v: Any) -> float | None:
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

        config = row["config"]
        return cls(json.loads(config) if isinstance(config, str) else dict(config), row["status"],
                   num(row.get("time_ms")), num(row.get("spread")), num(row.get("error")))


@dataclass
class SearchContext:
    """Everything a strategy may use to choose candidates at one problem."""

    spec: KernelSpec
    problem: Problem
    candidates: list[Config]  # constrained, full configs, space order; never empty
    measured: list[Observation] = field(default_factory=list)  # already in the store here
    hints: list[Config] = field(default_factory=list)  # e.g. best configs at neighbouring densities
    budget: int | None = None  # most measurements at this point, those already stored included
    seed: int = 0
    keys: list[str] | None = None  # the candidates' canonical JSON, when the caller has it already
    # the budget the search lays its phases out over when the driver stops it earlier, at ``budget``, to
    # set its budget anew later (a grid budget's first pass); None: ``budget``
    plan: int | None = None

    def remaining_budget(self, measured: int) -> int:
        return len(self.candidates) + 1 if self.budget is None else max(0, self.budget - measured)


class Strategy:
    """Base class: subclasses set ``name`` and implement :meth:`propose` (and :meth:`observe`)."""

    name: str = ""

    def __init__(self) -> None:
        self.ctx: SearchContext | None = None
        self.history: list[Observation] = []
        self._seen: set[str] = set()  # measured, or proposed and not yet observed

    @classmethod
    def planned(cls, candidates: int, budget: int | None) -> int:
        """How many measurements a point of ``candidates`` will take (for progress displays)."""
        return candidates if budget is None else min(candidates, budget)

    def start(self, ctx: SearchContext) -> None:
        """Begin a problem; ``ctx.measured`` seeds the history (resume and warm starts)."""
        self.ctx = ctx
        self.history = list(ctx.measured)
        self._seen = {o.key for o in ctx.measured}

    def propose(self, n: int) -> list[Config]:
        """Up to ``n`` not-yet-measured candidates from ``ctx.candidates``; [] when done."""
        raise NotImplementedError

    def set_budget(self, budget: int) -> None:
        """The point's budget anew, once the search stopped at the one it started with (a grid budget's
        second pass, :mod:`moetune.tuner.grid_budget`): it goes on from where it was, with all it
        measured, its phases laid out over ``budget`` from now on."""
        assert self.ctx is not None, "start() first"
        self.ctx = dataclasses.replace(self.ctx, budget=budget, plan=None)

    def first_choices(self, n: int) -> list[str] | None:
        """The keys of the ``n`` candidates this strategy's prior ranks first; None where it has none."""
        return None

    def upcoming(self, n: int) -> list[Config]:
        """Up to ``n`` unproposed candidates this strategy is likely to propose soon, proposing none:
        a parallel driver compiles them ahead on idle cores (a guess; wrong ones only cost CPU)."""
        return []

    def observe(self, results: Sequence[Observation]) -> None:
        """Results of proposed candidates (any order, possibly fewer than proposed)."""
        for o in results:
            self.history.append(o)
            self._seen.add(o.key)

    # ---- helpers for subclasses ----------------------------------------------------------
    def budget_left(self) -> int:
        assert self.ctx is not None, "start() first"
        return self.ctx.remaining_budget(len(self._seen))

    def fresh(self, configs: Sequence[Config], n: int) -> list[Config]:
        """The first ``n`` configs (within the budget) not yet measured or proposed; marks them proposed,
        so batches in flight on several GPUs never overlap or overrun the budget."""
        out: list[Config] = []
        limit = min(n, self.budget_left())
        for c in configs:
            if len(out) >= limit:
                break
            k = canonical_json(c)
            if k not in self._seen:
                out.append(c)
                self._seen.add(k)
        return out

    def best(self) -> Observation | None:
        ok = [o for o in self.history if o.ok]
        return min(ok, key=lambda o: o.time_ms) if ok else None


class FixedOrder(Strategy):
    """A strategy that walks one order fixed at :meth:`start` (exhaustive, random): a cursor moves
    through it, so each config is looked at once per search. Scanning from the top for every batch (as
    :meth:`Strategy.fresh` does) made a 14304-candidate sweep's driver slower than its GPU: a
    canonical JSON per candidate per batch, quadratic in the space."""

    def set_order(self, configs: Sequence[Config], keys: Sequence[str] | None = None) -> None:
        """The order to walk; ``keys``: the configs' canonical JSON when the caller has it."""
        self._order = list(configs)
        self._keys = list(keys) if keys is not None else [canonical_json(c) for c in self._order]
        self._cursor = 0

    def propose(self, n: int) -> list[Config]:
        """The next ``n`` configs (within the budget) in the order not yet measured or proposed."""
        assert self.ctx is not None, "start() first"
        out: list[Config] = []
        limit = min(n, self.budget_left())
        while len(out) < limit and self._cursor < len(self._order):
            k = self._keys[self._cursor]
            if k not in self._seen:
                out.append(self._order[self._cursor])
                self._seen.add(k)
            self._cursor += 1
        return out
