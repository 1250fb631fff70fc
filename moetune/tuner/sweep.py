"""The sweep: for each problem, the default first, then whatever the strategy proposes, into the store.

Every result is written the moment it arrives, so an interrupted or killed sweep
keeps all it measured; a rerun skips candidates the store already holds for the
same (kernel, device, shape, tokens, routes, active fraction, routing, config).
The library reports progress through an ``on_event`` callback; the CLI draws it.

:class:`Sweep` measures through a :class:`~moetune.tuner.backends.base.SequentialBackend`, one
point at a time; :class:`~moetune.tuner.parallel.ParallelSweep` is the same interface over a
:class:`~moetune.tuner.backends.base.PoolBackend`, every point at once.
:func:`moetune.tuner.factory.make_runner` picks the pair for the CLI's options.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo
from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec
from moetune.tables.picker import table_neighbours
from moetune.tuner.backends.base import Backend, SequentialBackend
from moetune.tuner.grid_budget import GridBudget, share_first_pass, share_second_pass
from moetune.tuner.store import Store
from moetune.tuner.strategies import DEFAULT_STRATEGY, STRATEGIES, Observation, SearchContext, get_strategy
from moetune.tuner.strategies.adaptive import AdaptiveStrategy
from moetune.tuner.strategies.base import Strategy
from moetune.tuner.worker import POINT_FAILED

# Candidates proposed (and compiled in parallel) at a time. Each batch waits for its slowest compile, so
# a big search wants few, large ones; the adaptive strategies cap theirs at a quarter of their budget,
# which is what limits them below ~1000 measurements a point (replay is the same at 64 and 256 there).
BATCH = 256
# Failures a rerun may measure again once their cause is fixed (e.g. out of GPU memory): they say
# nothing about the config. An inaccurate config stays banned; invalid is the space's own verdict.
RETRYABLE = ("crash", "timeout", "compile_error")
# Other densities' bests an earlier sweep left in the store, offered as warm starts (nearest first):
# a config that wins at one density is the likeliest to win next to it, and a fresh search there may
# never reach it (see docs/tuner.md, "Warm starts").
STORE_HINTS = 4


def check_retry(statuses: Sequence[str]) -> frozenset[str]:
    bad = sorted(set(statuses) - set(RETRYABLE))
    if bad:
        raise ValueError(f"--retry {','.join(bad)}: only {', '.join(RETRYABLE)} can be measured again")
    return frozenset(statuses)


REMEASURE = "remeasure"  # strategy tag of the final re-measurement rows


@dataclass
class Point:
    """One problem's search: its constrained candidates and what has been measured there."""

    spec: KernelSpec
    problem: Problem
    candidates: list[Config]
    pruned: int
    default: Config
    already: int = 0  # rows the store held before this sweep
    counts: collections.Counter = field(default_factory=collections.Counter)  # new rows by status
    best: Observation | None = None
    baseline: Observation | None = None  # the default's measurement
    keys: frozenset = frozenset()  # canonical JSON of every candidate (membership without re-encoding)
    candidate_keys: list[str] | None = None  # the same, in candidate order (strategies index by it)
    failure: str | None = None  # the spec's reference or input maker failed here: the point stopped
    budget: int | None = None  # most measurements here (None: the strategy's default)
    plan: int | None = None  # a grid budget's first pass: the budget its search plans for (SearchContext)
    extra: int = 0  # of them, what a grid budget's second pass added
    why: tuple[str, ...] = ()  # and why (grid_budget.disagreements)

    def note(self, obs: Observation) -> None:
        if obs.ok and (self.best is None or obs.time_ms < self.best.time_ms):
            self.best = obs
        if canonical_json(obs.config) == canonical_json(self.default):
            self.baseline = obs

    @property
    def speedup(self) -> float | None:
        if self.best and self.baseline and self.baseline.ok:
            return self.baseline.time_ms / self.best.time_ms
        return None


def full_config(spec: KernelSpec, candidate: Config) -> Config:
    """Default values under the candidate's, so stored configs always carry every key."""
    return {**spec.default, **candidate}


def family(kernel: str) -> str:
    """The kernel path an op belongs to ("fp4_prefill.down" -> "fp4_prefill")."""
    return kernel.split(".", 1)[0]


def load_starts(path: str | Path) -> list[Config]:
    """``--start``: a JSON file holding one config (an object) or a list of them. ValueError naming the
    file when it cannot be read or holds anything else."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--start {path}: cannot read a JSON config list ({e})") from None
    starts = [data] if isinstance(data, dict) else data
    if not isinstance(starts, list) or not starts or not all(isinstance(c, dict) and c for c in starts):
        raise ValueError(f"--start {path}: expected a config object or a non-empty list of them")
    return starts


def as_sibling_hint(spec: KernelSpec, config: Config) -> Config:
    """A config of another op of the same kernel path as a candidate of ``spec``: keys it lacks take
    the default's value, keys ``spec`` does not have are dropped. The ops of one path run one kernel on
    other operands (gate/up and down of one layer), so at one density their best tiles often agree; where
    they do not, it costs one measurement (see docs/tuner.md, "Warm starts")."""
    return {**spec.default, **{k: v for k, v in config.items() if k in spec.default}}


_SPACES: dict[tuple[str, str, str], list[tuple[Config, str]]] = {}


def _space(spec: KernelSpec) -> list[tuple[Config, str]]:
    """Every distinct full config of the spec's space with its canonical key, made once per space (a
    sweep plans dozens of points over the same space of tens of thousands of configs)."""
    ident = (spec.name, canonical_json(spec.space), canonical_json(spec.default))
    if ident not in _SPACES:
        out, seen = [], set()
        for raw in spec.candidates():
            cfg = full_config(spec, raw)
            key = canonical_json(cfg)
            if key not in seen:
                seen.add(key)
                out.append((cfg, key))
        _SPACES[ident] = out
    return _SPACES[ident]


def _constrain(spec: KernelSpec, problem: Problem, device: DeviceInfo, full_space: bool
               ) -> tuple[list[Config], list[str], frozenset, int]:
    space = _space(spec)
    if not full_space:
        space = [(cfg, key) for cfg, key in space if spec.dominated(cfg, device, problem.shape) is None]
    kept = [(cfg, key) for cfg, key in space if spec.constraint(cfg, problem, device) is None]
    keys = [key for _, key in kept]
    return [cfg for cfg, _ in kept], keys, frozenset(keys), len(_space(spec)) - len(kept)


def plan_point(spec: KernelSpec, problem: Problem, device: DeviceInfo, memo: dict | None = None, *,
               full_space: bool = False) -> Point:
    """The constrained candidate list, without the designs the spec marks dominated on ``device`` unless
    ``full_space``; ValueError when nothing survives. ``memo`` shares one constraint pass among points
    whose :meth:`KernelSpec.constraint_key` is equal."""
    if memo is None:
        cfgs, keys, key_set, pruned = _constrain(spec, problem, device, full_space)
    else:
        ident = (spec.name, spec.constraint_key(problem), device, full_space)
        if ident not in memo:
            memo[ident] = _constrain(spec, problem, device, full_space)
        cfgs, keys, key_set, pruned = memo[ident]
    if not keys:
        raise ValueError(f"{problem.describe()}: no candidate config passes the constraints "
                         f"({pruned} pruned)")
    return Point(spec, problem, [dict(c) for c in cfgs], pruned, dict(spec.default), keys=key_set,
                 candidate_keys=list(keys))


def plan_points(problems: Sequence[Problem], device: DeviceInfo, *, full_space: bool = False) -> list[Point]:
    """Constrain every problem's space up front: bad input fails before a store or worker is touched.
    Points that differ only in what their spec's constraint does not read share one pass over the space
    (a 54-point decode sweep has a dozen distinct ones)."""
    memo: dict = {}
    return [plan_point(get_spec(p.kernel), p, device, memo, full_space=full_space) for p in problems]


class Sweep:
    """Runs problems through a strategy, a backend and a store.

    The interface the CLI uses, shared by :class:`~moetune.tuner.parallel.ParallelSweep`: :meth:`plan`,
    :meth:`run`, :meth:`cross`, :meth:`unused_starts`, ``on_event``, ``timed_out``, ``overhead_ms``,
    ``phases_ms``, :attr:`measuring_busy` and :meth:`compiling`. ``prefetch``: idle compile workers
    compile what the strategies will likely propose next; only the parallel driver has idle ones (this
    one compiles its next batch ahead instead).
    """

    runner: Backend

    def __init__(self, store: Store, runner: SequentialBackend, *, strategy: str = DEFAULT_STRATEGY,
                 budget: int | None = None, seed: int = 0, on_event: Callable[..., None] | None = None,
                 sweep_id: str | None = None, batch: int = BATCH, time_limit: float | None = None,
                 retry: Sequence[str] = (), starts: Sequence[Config] = (), full_space: bool = False,
                 prefetch: bool = False, grid_budget: GridBudget | None = None):
        get_strategy(strategy)  # unknown name -> ValueError before anything runs
        if budget is not None and budget < 1:
            raise ValueError(f"--budget must be >= 1, got {budget}")
        if budget is not None and grid_budget is not None:
            raise ValueError("--budget (each point's) and --grid-budget (the sweep's) exclude each other")
        self.grid_budget = grid_budget
        self.grid_total: int | None = None  # the grid budget in measurements, once planned
        self.retry = check_retry(retry)
        if time_limit is not None and time_limit <= 0:
            raise ValueError(f"--time-limit must be positive, got {time_limit}")
        self.time_limit = time_limit
        self.timed_out = False  # stopped by the time limit (everything measured is stored)
        self.store, self.runner = store, runner
        self.strategy, self.budget, self.seed, self.batch = strategy, budget, seed, batch
        self.starts = [dict(c) for c in starts]  # the user's warm starts (``--start``), first at every point
        self.full_space = full_space  # also the designs the specs mark dominated (``--full-space``)
        self.prefetch = prefetch
        self.on_event = on_event or (lambda *a, **k: None)
        self.sweep_id = sweep_id or uuid.uuid4().hex[:12]
        self.points: list[Point] = []
        self._deadline: float | None = None
        self.overhead_ms: list[float] = []  # per measured candidate: wall time beyond its timed runs
        # per timed candidate, ms: inputs, reference, check, timing (kernel runs included), kernel, store,
        # worker (its whole task) and parent (submit to result, pipe and scheduling included)
        self.phases_ms: list[dict[str, float]] = []

    @property
    def measuring_busy(self) -> float | None:
        """Share of the measuring workers' time spent on tasks; None where the driver does not count it."""
        return None

    def compiling(self) -> dict[str, float] | None:
        """The backend's compile statistics (:meth:`~moetune.tuner.backends.base.Backend.compiling`)."""
        return self.runner.compiling()

    # ---- store access ------------------------------------------------------------------------------------
    def _key(self, p: Problem) -> dict[str, Any]:
        return {"kernel": p.kernel, "device_name": self.device.name, "shape": p.shape_key, "tokens": p.tokens,
                "routes": p.routes, "active_fraction": p.active_fraction, "routing": p.routing}

    def _stored(self, p: Problem) -> list[Observation]:
        """The point's stored rows; configs stored before a key joined the space get its default (what
        they ran with), so resume recognises them. Configs whose rows all failed in a way ``retry``
        names count as not measured (their rows stay in the store)."""
        spec = get_spec(p.kernel)
        rows = [dataclasses.replace(o, config=full_config(spec, o.config)) for o in
                map(Observation.from_row, self.store.frame(**self._key(p)).to_dict("records"))]
        if self.retry:
            kept = {o.key for o in rows if o.status not in self.retry}
            rows = [o for o in rows if o.key in kept]
        return rows

    def _row(self, point: Point, config: Config, res: dict[str, Any]) -> dict[str, Any]:
        p, d = point.problem, self.device
        row = {**self._key(p), "sweep_id": self.sweep_id, "arch": d.arch, **self.runner.versions,
               "density": p.density, "config": canonical_json(config), "strategy": self.strategy,
               "launch": get_spec(p.kernel).launch_contract(d.arch)}
        for k in ("status", "reason", "error", "time_ms", "min_ms", "spread", "n_runs", "bytes", "flops",
                  "roofline_frac"):
            if res.get(k) is not None:
                row[k] = res[k]
        return row

    # ---- the sweep -----------------------------------------------------------------------------------------
    def plan(self, problems: Sequence[Problem] | Sequence[Point], device: DeviceInfo) -> list[Point]:
        """Take the problems (or points already planned by :func:`plan_points`) and what the store holds."""
        self.device = device
        memo: dict = {}
        self.points = [p if isinstance(p, Point)
                       else plan_point(get_spec(p.kernel), p, device, memo, full_space=self.full_space)
                       for p in problems]
        for pt in self.points:
            pt.budget, pt.plan = self.budget, None
            stored = self._stored(pt.problem)
            pt.already = len(stored)
            for o in stored:
                pt.note(o)
        return self.points

    def expected(self, pt: Point) -> int:
        """Measurements this sweep will still make at ``pt`` (for the progress bar)."""
        total = len({canonical_json(c) for c in pt.candidates} | {canonical_json(pt.default)})
        return max(0, STRATEGIES[self.strategy].planned(total, pt.budget) - pt.already)

    def run(self, problems: Sequence[Problem] | None = None) -> list[Point]:
        if problems is not None or not self.points:
            if self.runner.device is None:
                self.runner.start()
            self.plan(problems or [], self.runner.device)
        self._first_pass()
        self.on_event("start", points=self.points, total=sum(self.expected(pt) for pt in self.points))
        self._deadline = None if self.time_limit is None else time.monotonic() + self.time_limit
        self._searches: dict[int, Strategy] = {}
        for final in (False, True) if self.grid_budget else (True,):
            if final and self.grid_budget:
                self._second_pass(self._searches)
            for i, pt in enumerate(self.points):
                if self._out_of_time():
                    break
                self._run_point(i, pt, final)
        self.on_event("done", points=self.points)
        return self.points

    def _first_pass(self) -> None:
        if self.grid_budget is not None:
            self.grid_total = share_first_pass(self.points, self.grid_budget, STRATEGIES[self.strategy])

    def _second_pass(self, searches: dict[int, Strategy]) -> None:
        if not self._out_of_time():
            more = share_second_pass(self.points, searches, self.grid_total)
            self.on_event("second_pass", points=self.points, total=more)

    def cross(self) -> None:
        """Measure each point's best at every other point of the same op, shape and routing that has not
        measured it (``moetune sweep --cross``, after :meth:`run`): one sub-sweep per such group, with
        those bests as its starts and a budget of one, so nothing else is measured. The picker serves a
        density between two entries with the nearer entry's config, which that entry's own search may
        never have tried at the other densities (see docs/tuner.md, "Cross")."""
        groups: dict[tuple, list[Point]] = collections.defaultdict(list)
        for pt in self.points:
            groups[(pt.problem.kernel, pt.problem.shape_key, pt.problem.routing)].append(pt)
        for group in groups.values():
            bests = {canonical_json(pt.best.config): pt.best.config for pt in group if pt.best is not None}
            if len(group) < 2 or not bests:
                continue
            left = None if self._deadline is None else self._deadline - time.monotonic()
            if left is not None and left <= 0:
                self.timed_out = True
                return
            sub = type(self)(self.store, self.runner, strategy=self.strategy, budget=1, seed=self.seed,
                             on_event=self.on_event, sweep_id=self.sweep_id, batch=self.batch,
                             time_limit=left, retry=self.retry, starts=list(bests.values()),
                             full_space=self.full_space)
            sub.plan(group, self.device)
            sub.run()
            self.overhead_ms += sub.overhead_ms
            self.phases_ms += sub.phases_ms
            if sub.timed_out:
                self.timed_out = True
                return

    def _out_of_time(self) -> bool:
        if self._deadline is not None and time.monotonic() > self._deadline:
            self.timed_out = True
        return self.timed_out

    def _hints(self, i: int) -> list[Config]:
        """Warm starts: the user's ``starts`` in this point's space (an adaptive search descends from them
        first), the spec's heuristic for this point (so a table never loses to the fallback it
        replaces for want of measuring it), the best configs the other ops of its kernel path found
        at the same routes, the configs of the tables' entries on either side of this density (what
        the picker runs here today), the best configs found so far for the same op and shape at
        other densities in this sweep, nearest density first, then the nearest ``STORE_HINTS`` other
        points' bests that the store holds from earlier sweeps."""
        me = self.points[i]
        mp = me.problem
        near = [pt for pt in self.points[:i] if pt.problem.kernel == mp.kernel
                and pt.problem.shape_key == mp.shape_key and pt.best is not None]
        near.sort(key=lambda pt: abs(pt.problem.density - mp.density))
        siblings = [as_sibling_hint(me.spec, pt.best.config) for pt in self.points if pt.best is not None
                    and pt.problem.kernel != mp.kernel and family(pt.problem.kernel) == family(mp.kernel)
                    and (pt.problem.tokens, pt.problem.routes, pt.problem.active_fraction, pt.problem.routing)
                    == (mp.tokens, mp.routes, mp.active_fraction, mp.routing)]
        tabled = [full_config(me.spec, c) for c in table_neighbours(mp.kernel, mp.shape, mp.routes,
                                                                      device=self.device)]
        hints = [c for c in siblings + tabled if canonical_json(c) in me.keys]
        hints += [pt.best.config for pt in near]
        mine = (mp.tokens, mp.routes, mp.active_fraction, mp.routing)
        stored = [r for r in self.store.best_per_point(mp.kernel, self.device.name, mp.shape_key)
                  if (r["tokens"], r["routes"], r["active_fraction"], r["routing"]) != mine and r["density"]]
        stored.sort(key=lambda r: abs(math.log(r["density"] / mp.density)) if mp.density else r["density"])
        earlier = [full_config(me.spec, json.loads(r["config"])) for r in stored[:STORE_HINTS]]
        hints += [c for c in earlier if canonical_json(c) in me.keys]
        heuristic = full_config(me.spec, me.spec.heuristic(me.problem.shape, me.problem.routes,
                                                           self.device.arch))
        if canonical_json(heuristic) in me.keys:
            hints.insert(0, heuristic)
        starts = [c for c in (as_sibling_hint(me.spec, c) for c in self.starts)
                  if canonical_json(c) in me.keys]
        return list({canonical_json(c): c for c in starts + hints}.values())  # each once, where it first came

    def _fail_point(self, pt: Point, res: dict[str, Any]) -> None:
        """The spec itself failed at ``pt`` (its reference or input maker raised): stop the point,
        store nothing against the config, so the next run measures it."""
        p = pt.problem
        pt.failure = f"{p.kernel} {p.describe()}: {res.get('reason') or 'the spec failed'}"
        self.on_event("point_failed", point=pt, reason=pt.failure)

    def _measure(self, pt: Point, configs: Sequence[Config], ahead: Sequence[Config] = (),
                 budgeted: bool = False) -> list[Observation]:
        """Measure and store each config, skipping ones another sweep on the same store has
        measured or is measuring (claims expire, so a killed sweep's candidates come back) and, when
        ``budgeted``, ones past the budget that cooperating sweeps have spent at the point together."""
        key = self._key(pt.problem)
        ttl = 3 * self.runner.timeout + 60
        budget = pt.budget if budgeted else None

        def admit(config: Config) -> bool:
            return self.store.claim(key, config, ttl, self.retry, budget)

        out = []
        def best() -> float | None:
            return pt.best.time_ms if pt.best else None

        for config, res in self.runner.measure(pt.spec, pt.problem, configs, self.seed, admit, ahead, best):
            t0 = time.monotonic()
            if res.get("status") == POINT_FAILED:
                self.store.release(key, config)
                self._fail_point(pt, res)
                break
            row = self._row(pt, config, res)
            self.store.add(row)
            self.store.release(key, config)
            obs = Observation.from_row(row)
            pt.counts[obs.status] += 1
            pt.note(obs)
            out.append(obs)
            if "kernel_ms" in res and "parent_ms" in res:
                store_ms = (time.monotonic() - t0) * 1e3
                self.overhead_ms.append(res["parent_ms"] + store_ms - res["kernel_ms"])
                self.phases_ms.append({**res.get("phases_ms", {}), "store": store_ms,
                                       "kernel": res["kernel_ms"], "worker": res.get("wall_ms", 0.0),
                                       "parent": res["parent_ms"]})
            self.on_event("result", point=pt, row=row, obs=obs)
            if self._out_of_time():
                break
        return out

    def unused_starts(self) -> list[int]:
        """Indices of the user's ``starts`` that lie in no planned point's space (after ``plan``)."""
        return [i for i, c in enumerate(self.starts)
                if not any(canonical_json(as_sibling_hint(pt.spec, c)) in pt.keys for pt in self.points)]

    def _firsts(self, pt: Point) -> list[Config]:
        """What a point measures before its strategy starts, unless the store has it: the default (the
        baseline), then the user's ``starts`` that lie in the point's space (keys the op lacks dropped,
        missing ones the default's), whatever the strategy, so they count with its budget."""
        measured = {o.key for o in self._stored(pt.problem)}
        starts = [c for c in (as_sibling_hint(pt.spec, c) for c in self.starts)
                  if canonical_json(c) in pt.keys]
        firsts = {canonical_json(c): c for c in [pt.default, *starts]}
        return [c for k, c in firsts.items() if k not in measured]

    def _run_point(self, i: int, pt: Point, final: bool = True) -> None:
        """The default and starts, the strategy's proposals up to ``pt.budget``, then (``final``) the
        re-measurement; a grid budget's second pass goes on with the strategy in ``_searches``."""
        if pt.failure:
            return
        self.on_event("point", point=pt)
        strategy = self._searches.get(i)
        if strategy is None:
            firsts = self._firsts(pt)
            if firsts:
                self._measure(pt, firsts)
            if self._out_of_time() or pt.failure:
                return
            strategy = self._searches[i] = get_strategy(self.strategy)
            strategy.start(SearchContext(pt.spec, pt.problem, pt.candidates, self._stored(pt.problem),
                                         self._hints(i), pt.budget, self.seed, pt.candidate_keys, pt.plan))
        # A strategy that does not learn from results can propose the next batch before this one is
        # measured, so the compile workers build it meanwhile (proposed configs are never re-proposed).
        early = not isinstance(strategy, AdaptiveStrategy)
        batch = strategy.propose(self.batch)
        while batch:
            ahead = strategy.propose(self.batch) if early else []
            strategy.observe(self._measure(pt, batch, ahead, budgeted=True))
            if self._out_of_time() or pt.failure:
                return
            batch = ahead if early else strategy.propose(self.batch)
        if final:
            self._remeasure(pt, strategy)

    def _remeasure(self, pt: Point, strategy: Any) -> None:
        """The strategy's final, interleaved re-measurement of its top candidates.

        Stored as extra rows tagged ``strategy = "remeasure"`` (export pools repeated measurements
        of a config); a point that already has such rows is not re-measured again on resume.
        """
        again = strategy.remeasure() if hasattr(strategy, "remeasure") else []
        if not again or any(r == REMEASURE for r in self.store.frame(**self._key(pt.problem))["strategy"]):
            return
        per_round = len({canonical_json(c) for c in again})
        obs = []
        for r in range(0, len(again), per_round):  # the runner measures a batch's distinct configs once
            for config, res in self.runner.measure(pt.spec, pt.problem, again[r:r + per_round],
                                                   self.seed + 1 + r // per_round):
                if res.get("status") == POINT_FAILED:
                    self._fail_point(pt, res)
                    return
                row = {**self._row(pt, config, res), "strategy": REMEASURE}
                self.store.add(row)
                o = Observation.from_row(row)
                pt.note(o)
                obs.append(o)
                self.on_event("result", point=pt, row=row, obs=o)
            if self._out_of_time():
                return
        strategy.observe_remeasured(obs)
