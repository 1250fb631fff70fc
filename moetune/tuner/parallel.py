"""The parallel driver: every point's search at once over a :class:`~moetune.tuner.backends.base.PoolBackend`.

The plain :class:`~moetune.tuner.sweep.Sweep` searches one problem at a time.
:class:`ParallelSweep` searches several at once, earliest first, so no worker idles
while a point waits for its default's result or its strategy waits for a batch.
Strategies that learn from results
(:class:`~moetune.tuner.strategies.adaptive.AdaptiveStrategy`) are asked for the same
batches as in the plain sweep (``propose(BATCH)``, which they cap at a quarter of their
budget), each batch observed whole before the next, so the search does not depend on
how many GPUs run it; the others keep a sweep batch in flight so compiles run ahead of
the GPUs. A batch goes to the compile workers longest compile first
(:meth:`~moetune.specs.base.KernelSpec.compile_cost`), after the strategy's first pick,
so it does not wait on a slow compile started last, and configs that share a binary
(:meth:`~moetune.specs.base.KernelSpec.binary_key`) after the first of them, so it is
built once.

The sweep process stays the only writer of the store, so resume, claims and the
no-loss rule hold as on one GPU; workers only measure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec
from moetune.tuner.backends.base import BusyClock, PoolBackend, measure_task
from moetune.tuner.store import Store
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.strategies.adaptive import AdaptiveStrategy
from moetune.tuner.sweep import REMEASURE, Point, Sweep
from moetune.tuner.worker import POINT_FAILED


def compile_order(spec: KernelSpec, configs: Sequence[Config], first: Sequence[Config] = ()) -> list[Config]:
    """``configs`` in the order their compiles should start: longest first (a batch waits for its last
    compile), and each binary (:meth:`~moetune.specs.base.KernelSpec.binary_key`) before every other config
    that runs it, also those of ``first`` (queued before): those then find it in Triton's cache instead
    of building it at the same time on another worker."""
    seen = {spec.binary_key(c) for c in first}
    new, again = [], []
    for c in sorted(configs, key=spec.compile_cost, reverse=True):
        key = spec.binary_key(c)
        (again if key in seen else new).append(c)
        seen.add(key)
    return new + again


@dataclass
class _Search:
    """One point's search in flight: its default first, alone, then its strategy's proposals."""

    index: int
    point: Point
    strategy: Any = None
    pending: set = field(default_factory=set)  # keys in flight
    started: bool = False  # the default was looked at (measured, stored or claimed elsewhere)
    idle: bool = False  # the strategy said "nothing now"; ask again after the next result
    finished: bool = False
    finals: list | None = None  # the final re-measurement still to submit (None: not reached yet)
    final_obs: list = field(default_factory=list)


class ParallelSweep(Sweep):
    """A :class:`Sweep` over a :class:`~moetune.tuner.backends.base.PoolBackend`: the same options and
    the same run/cross/summary interface, every point in flight at once.

    ``prefetch``: idle compile workers compile what the strategies will likely propose next
    (:meth:`Strategy.upcoming`), where the backend has any (``idle_compilers``). Off by default: the
    extra compiles slow the measuring workers' host work more than cached binaries save (see
    docs/tuner.md, "Prefetch").
    """

    runner: PoolBackend

    def __init__(self, store: Store, runner: PoolBackend, **kwargs: Any):
        super().__init__(store, runner, **kwargs)
        self.busy = BusyClock()
        self._final = True

    @property
    def measuring_busy(self) -> float | None:
        """Share of the measuring workers' time spent on tasks (see :class:`BusyClock`)."""
        return self.busy.fraction(len(self.runner.workers))

    def run(self, problems: Sequence[Problem] | None = None) -> list[Point]:
        if self.runner.device is None:
            self.runner.start()
        if problems is not None or not self.points:
            self.plan(problems or [], self.runner.device)
        elif self.runner.device != self.device:  # planned on the driver, measured elsewhere (a Ray cluster)
            self.plan([pt.problem for pt in self.points], self.runner.device)
        self._first_pass()
        self.on_event("start", points=self.points, total=sum(self.expected(pt) for pt in self.points),
                      workers=self.runner.workers)
        self._deadline = None if self.time_limit is None else time.monotonic() + self.time_limit
        searches = [_Search(i, pt) for i, pt in enumerate(self.points)]
        inflight: dict[Any, tuple[_Search, Config]] = {}
        self._prefetched: set[tuple[int, str]] = set()
        try:
            for final in (False, True) if self.grid_budget else (True,):
                self._final = final  # False: a grid budget's first pass, each search stops before its finals
                if final and self.grid_budget:  # every first pass done: the rest where they disagree
                    self._second_pass({s.index: s.strategy for s in searches if s.strategy is not None})
                    for s in searches:
                        s.finished = s.finished and (s.strategy is None or s.point.failure is not None)
                        s.idle = False
                while True:
                    if not self._out_of_time():
                        self._fill(searches, inflight)
                        if self.prefetch:
                            self._prefetch(searches)
                    if not inflight:
                        break
                    for key, res, worker in self.runner.poll():
                        search, config = inflight.pop(key)
                        self._record(search, key, config, res, worker)
        finally:  # stopped early: what was not measured goes back to whoever sweeps next
            for search, config in inflight.values():
                self.store.release(self._key(search.point.problem), config)
        self.on_event("done", points=self.points)
        return self.points

    def _fill(self, searches: list[_Search], inflight: dict[Any, tuple[_Search, Config]]) -> None:
        ttl = 3 * self.runner.timeout + 60
        free = self.runner.capacity()
        for s in searches:
            while free > 0 and not s.finished:
                configs = self._next(s, free)
                if not configs:
                    break
                pt = s.point
                if s.finals is None:  # the strategy's first pick (a sweep's heuristic, re-checked later)
                    configs = configs[:1] + compile_order(pt.spec, configs[1:], first=configs[:1])
                key_of = self._key(pt.problem)
                # finalists are re-measured in full, whatever the best so far
                best = pt.best.time_ms if pt.best and s.finals is None else None
                # the strategy's proposals count against the budget that cooperating sweeps share
                budget = pt.budget if s.strategy is not None else None
                for config in configs:
                    if s.finals is not None:  # re-measuring stored configs: no claim, a key per round
                        key = (s.index, canonical_json(config), REMEASURE, len(s.final_obs) + len(s.pending))
                    elif not self.store.claim(key_of, config, ttl, self.retry, budget):
                        continue  # stored meanwhile, measured elsewhere, or the point's budget is spent
                    else:
                        key = (s.index, canonical_json(config))
                    inflight[key] = (s, config)
                    s.pending.add(key)
                    self.runner.submit(key, measure_task(pt.spec, pt.problem, config, self.seed,
                                                         self.runner.timing, best),
                                       f"{pt.problem.kernel} t{pt.problem.tokens} r{pt.problem.routes}")
                    free -= 1
            if free <= 0:
                return

    def _prefetch(self, searches: list[_Search]) -> None:
        """Idle compile workers build what the searches will likely ask for next, so a batch chosen
        from the last results finds its binaries cached instead of waiting seconds for the compiler."""
        idle = self.runner.idle_compilers()
        active = [s for s in searches if s.strategy is not None and not s.finished and s.finals is None]
        if idle <= 0 or not active:
            return
        share = -(-idle // len(active))
        for s in active:
            pt = s.point
            for config in s.strategy.upcoming(4 * share):  # deeper than the share: some are compiled
                key = (s.index, canonical_json(config))
                if key in self._prefetched:
                    continue
                self._prefetched.add(key)
                self.runner.prefetch(measure_task(pt.spec, pt.problem, config, self.seed))
                idle -= 1
                if idle <= 0:
                    return

    def _next(self, s: _Search, free: int) -> list[Config]:
        pt = s.point
        if not s.started:
            s.started = True
            self.on_event("point", point=pt)
            firsts = self._firsts(pt)  # the baseline (and the user's starts), always first
            if firsts:
                return firsts
        if s.strategy is None:
            if s.pending:
                return []  # the default is being measured; the strategy starts from its result
            s.strategy = get_strategy(self.strategy)
            s.strategy.start(SearchContext(pt.spec, pt.problem, pt.candidates, self._stored(pt.problem),
                                           self._hints(s.index), pt.budget, self.seed, pt.candidate_keys,
                                           pt.plan))
        if s.finals is not None:
            batch, s.finals = s.finals[:free], s.finals[free:]
            s.finished = not batch and not s.pending
            if s.finished and s.final_obs:
                s.strategy.observe_remeasured(s.final_obs)
            return batch
        if s.idle:
            return []
        workers = len(self.runner.workers)
        if isinstance(s.strategy, AdaptiveStrategy):  # whole batches, as large as on one GPU (the
            n = 0 if s.pending else max(self.batch, workers)  # strategy caps them), so its search is too
        else:
            n = min(free, max(self.batch, workers) - len(s.pending))
        batch = s.strategy.propose(n) if n > 0 else []
        if not batch:
            s.idle = bool(s.pending)
            if not s.pending and not self._final:  # a grid budget's first pass: on hold for the second
                s.finished = True
            elif not s.pending:
                s.finals = self._finals(s)
                return self._next(s, free)
        return batch

    def _finals(self, s: _Search) -> list[Config]:
        """The strategy's final re-measurement, unless this point already has one stored (resume)."""
        again = s.strategy.remeasure() if hasattr(s.strategy, "remeasure") else []
        stored = self.store.frame(**self._key(s.point.problem))["strategy"]
        return [] if any(t == REMEASURE for t in stored) else list(again)

    def _record(self, s: _Search, key: Any, config: Config, res: dict[str, Any], worker: str) -> None:
        t0 = time.monotonic()
        s.pending.discard(key)
        pt = s.point
        final = len(key) > 2 and key[2] == REMEASURE
        if res.get("status") == POINT_FAILED or pt.failure:  # the spec failed here: nothing is stored
            if not final:
                self.store.release(self._key(pt.problem), config)
            if pt.failure is None:
                s.finished = True
                self._fail_point(pt, res)
            return
        row = self._row(pt, config, res)
        if final:
            row["strategy"] = REMEASURE
        self.store.add(row)
        obs = Observation.from_row(row)
        pt.note(obs)
        if final:
            s.final_obs.append(obs)
        else:
            self.store.release(self._key(pt.problem), config)
            pt.counts[obs.status] += 1
            if s.strategy is not None:
                s.strategy.observe([obs])
                s.idle = False
        if res.get("wall_ms") is not None:
            self.busy.add(t0, res["wall_ms"] / 1e3)
        if "kernel_ms" in res and "parent_ms" in res:
            store_ms = (time.monotonic() - t0) * 1e3
            self.overhead_ms.append(res["parent_ms"] + store_ms - res["kernel_ms"])
            self.phases_ms.append({**res.get("phases_ms", {}), "store": store_ms, "kernel": res["kernel_ms"],
                                   "worker": res.get("wall_ms", 0.0), "parent": res["parent_ms"]})
        self.on_event("result", point=pt, row=row, obs=obs, worker=worker)
