"""A prior from everything measured: the configs that won at similar points are proposed first.

:class:`PriorData` holds, per measured point (a *site*: op, shape, density, routing),
every config's log time over the site's best (slow ones and failures capped at
``CAP``). Its prediction at a new point is a weighted mean over the sites of the
same kernel path, each weighted by how near it is (:func:`site_distance`: route
density, N, K, E, top_k, op, routing), shrunk towards "mediocre" where few sites
measured a config. The data comes from the committed stores (``data/`` of the
repository) and grows with the current sweep: every observation of a ``prior``
search is added as it comes, so the points of one sweep share one model and a
density learns from its neighbours' whole searches, not only their winners.

:class:`PriorGuided` is :class:`~.model.ModelGuided` with that prior: after the
warm starts it measures the prior's best-ranked candidates (instead of a random
sample), and its Gaussian process models the residual from the prior, so the
expected improvement starts from what similar points say instead of from nothing.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moetune.problem import Config, Problem, canonical_json
from moetune.tuner.strategies.adaptive import MIN_BUDGET
from moetune.tuner.strategies.base import Observation, SearchContext
from moetune.tuner.strategies.model import ModelGuided

CAP = math.log(2.0)  # log(time / best) at or above which every config is equally uninteresting
UNKNOWN = 0.5 * CAP  # what the prior assumes of a config no near site measured
SHRINK = 0.15  # weight of that assumption, as a share of the nearest site's weight
NEAREST = 24  # most sites a prediction averages over
MIN_SITE = 5  # ok configs a site needs to say which are fast
NEIGHBOUR = 0.3  # weight of a one-step neighbour's evidence for a config few near sites measured
SMOOTH_BELOW = 1.0  # smoothed: configs with less evidence than this many shrink weights
DEFAULT_SHARE = 0.05  # of a point's candidates, when no budget is given (docs/tuner.md, "Replay")
REFRESH = 1.5  # the prior is recomputed when the other points' readings grew by this factor
PRIOR_SHARE = 0.35  # of the search budget: the prior's ranking, after the warm starts
PRIOR_POLISH = 0.6  # share of the budget after which the polish starts (the model's is later)
CONTEND = 1.15  # a design contends while its fastest measured config reads within this of the best
TRUST = 2  # the model picks among the neighbours of each contending design's fastest this many
MIN_PRIOR = 2  # of the prior's first picks measured, however many warm starts took its share
# (distance per log2 step or mismatch): docs/tuner.md, "The prior"
WEIGHTS = {"density": 2.0, "N": 0.5, "K": 0.5, "E": 0.25, "top_k": 0.5, "op": 1.5, "routing": 1.0,
           "active": 1.0}
DATA_DIR = Path(__file__).resolve().parents[3] / "data"


def _family(kernel: str) -> str:
    return kernel.split(".", 1)[0]


@dataclass
class Site:
    """One measured point: every config's log time over the site's best."""

    kernel: str
    shape: dict[str, Any]
    routes: int
    active_fraction: float
    routing: str
    rel: dict[str, float] = field(default_factory=dict)  # config key -> log(time / best), capped

    @property
    def key(self) -> str:
        return site_key(self.kernel, self.shape, self.routes, self.active_fraction, self.routing)


def site_key(kernel: str, shape: Mapping[str, Any], routes: int, active: float, routing: str) -> str:
    return f"{kernel}|{canonical_json(dict(shape))}|{routes}|{active:g}|{routing}"


def model_key(kernel: str, shape: Mapping[str, Any]) -> str:
    """The model layer an op's shape belongs to: gate/up (K = hidden, N = 2 x intermediate) and down
    (N = hidden, K = intermediate) of one layer share it, so holding out a model holds out both ops."""
    op = kernel.split(".", 1)[-1]
    hidden, inter = (shape["N"], shape["K"]) if op == "down" else (shape["K"], shape["N"] // 2)
    return f"{_family(kernel)} E={shape['E']} top_k={shape['top_k']} hidden={hidden} inter={inter}"


def site_distance(a: Site, kernel: str, shape: Mapping[str, Any], routes: int, active: float,
                  routing: str) -> float:
    def step(x: float, y: float) -> float:
        return abs(math.log2(max(x, 1e-9)) - math.log2(max(y, 1e-9)))

    w = WEIGHTS
    return (w["density"] * step(a.routes / a.shape["E"], routes / shape["E"])
            + w["N"] * step(a.shape["N"], shape["N"]) + w["K"] * step(a.shape["K"], shape["K"])
            + w["E"] * step(a.shape["E"], shape["E"]) + w["top_k"] * step(a.shape["top_k"], shape["top_k"])
            + w["op"] * (a.kernel != kernel) + w["routing"] * (a.routing != routing)
            + w["active"] * abs(a.active_fraction - active))


def _rel(times: Mapping[str, float], failed: Iterable[str]) -> dict[str, float]:
    best = min(times.values())
    out = {k: min(CAP, math.log(t / best)) for k, t in times.items()}
    out.update({k: CAP for k in failed if k not in times})
    return out


class PriorData:
    """Sites to learn from: the committed stores and the current sweep's observations."""

    def __init__(self, sites: Iterable[Site] = ()):
        self.sites: dict[str, Site] = {s.key: s for s in sites}  # stored
        self.live: dict[str, Site] = {}  # the current sweep's, by site key
        self._live: dict[str, tuple[dict[str, float], set[str]]] = {}  # site key -> (times, failed)

    @classmethod
    def from_frame(cls, frame, canonical: Callable[[str, str], str] | None = None) -> PriorData:
        """Sites from store rows (``read_frame``); ``canonical(kernel, config_json)`` maps a stored config
        to the key a sweep of today's spec gives it (:func:`as_swept` by default)."""
        canonical = canonical or as_swept
        pairs = frame[["kernel", "config"]].drop_duplicates()
        keys = {(k, c): canonical(k, c) for k, c in zip(pairs["kernel"], pairs["config"], strict=True)}
        frame = frame.assign(key=[keys[kc] for kc in zip(frame["kernel"], frame["config"], strict=True)])
        readings: dict[tuple, dict[str, list[float]]] = {}
        failed: dict[tuple, set[str]] = {}
        cols = ["kernel", "shape", "routes", "active_fraction", "routing", "key", "status", "time_ms"]
        for kernel, shape, routes, active, routing, key, status, t in zip(*(frame[c].tolist() for c in cols),
                                                                           strict=True):
            site = (kernel, shape, int(routes), float(active), str(routing))
            if status == "ok" and t is not None and t == t and t > 0:
                readings.setdefault(site, {}).setdefault(key, []).append(float(t))
            else:
                failed.setdefault(site, set()).add(key)
        sites = []
        for (kernel, shape, routes, active, routing), per in readings.items():
            if len(per) >= MIN_SITE:
                times = {k: statistics.median(ts) for k, ts in per.items()}
                sites.append(Site(kernel, json.loads(shape), routes, active, routing,
                                  _rel(times, failed.get((kernel, shape, routes, active, routing), set()))))
        return cls(sites)

    @classmethod
    def from_stores(cls, paths: Sequence[str | Path]) -> PriorData:
        import pandas as pd

        from moetune.tuner.store import read_frame

        frames = [read_frame(p, "--train") for p in paths]
        return cls.from_frame(pd.concat(frames, ignore_index=True)) if frames else cls()

    def without(self, keep: Callable[[Site], bool]) -> PriorData:
        """A copy holding the stored sites ``keep`` accepts, and none of the current sweep's."""
        return PriorData(s for s in self.sites.values() if keep(s))

    def add(self, problem: Problem, results: Sequence[Observation]) -> None:
        """The current sweep's observations at ``problem``: its site is rebuilt from all of them."""
        key = site_key(problem.kernel, problem.shape, problem.routes, problem.active_fraction,
                       problem.routing)
        times, failed = self._live.setdefault(key, ({}, set()))
        for o in results:
            if o.ok:
                times[o.key] = min(times.get(o.key, math.inf), o.time_ms)
            else:
                failed.add(o.key)
        if len(times) >= MIN_SITE:
            self.live[key] = Site(problem.kernel, dict(problem.shape), problem.routes,
                                   problem.active_fraction, problem.routing, _rel(times, failed))

    def live_readings(self, problem: Problem) -> int:
        """How many of the current sweep's readings at other points the prior at ``problem`` can use."""
        me = site_key(problem.kernel, problem.shape, problem.routes, problem.active_fraction,
                      problem.routing)
        return sum(len(s.rel) for k, s in list(self.live.items()) if k != me)

    def predict(self, problem: Problem, index: Mapping[str, int], n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate (``index``: key -> position, ``n`` candidates): the prior's log time over the
        point's best, and the weight of evidence behind it (0: no near site measured it). The stored
        sites count whatever their point; the current sweep's, all but the point's own (its search
        models those readings itself)."""
        me = site_key(problem.kernel, problem.shape, problem.routes, problem.active_fraction,
                      problem.routing)
        sites = [*self.sites.values(), *(s for k, s in list(self.live.items()) if k != me)]
        near = sorted(((site_distance(s, problem.kernel, problem.shape, problem.routes,
                                      problem.active_fraction, problem.routing), s)
                       for s in sites if _family(s.kernel) == _family(problem.kernel)),
                      key=lambda ds: ds[0])[:NEAREST]
        total, weight = np.zeros(n), np.zeros(n)
        for d, s in near:
            w = math.exp(-d)
            for k, r in s.rel.items():
                i = index.get(k)
                if i is not None:
                    total[i] += w * r
                    weight[i] += w
        w0 = SHRINK * (math.exp(-near[0][0]) if near else 1.0)
        return (total + w0 * UNKNOWN) / (weight + w0), weight


def as_swept(kernel: str, config: str) -> str:
    """A stored config's key as a sweep of today's spec proposes it: keys the data predates take the
    default's value (the resume rule) and equivalent configs share one representative (as at export)."""
    spec = _spec(kernel)
    return config if spec is None else canonical_json(spec.canonical({**spec.default, **json.loads(config)}))


_SPECS: dict[str, Any] = {}


def _spec(kernel: str):
    if kernel not in _SPECS:
        from moetune.specs.registry import get_spec

        try:
            _SPECS[kernel] = get_spec(kernel)
        except (KeyError, ValueError):
            _SPECS[kernel] = None
    return _SPECS[kernel]


_SHARED: list[PriorData] = []


def committed_stores(root: Path = DATA_DIR) -> list[Path]:
    """The stores committed under ``data/`` (none when moetune runs from an installed package)."""
    return sorted(root.glob("*/*/*.sqlite.gz")) if root.is_dir() else []


def shared() -> PriorData:
    """The process's prior: the committed stores, then every ``prior`` search's observations."""
    if not _SHARED:
        _SHARED.append(PriorData.from_stores(committed_stores()))
    return _SHARED[0]


class PriorGuided(ModelGuided):
    name = "prior"
    # DeepSeek-V3 TP4's 96-point decode grid in 252 s on an H200, within 0.8% of direct sweeps at six
    # points (docs/performance.md, "What tuning costs")
    grid_share = 0.012
    polish = PRIOR_POLISH

    @classmethod
    def planned(cls, candidates: int, budget: int | None) -> int:
        total = budget if budget is not None else max(MIN_BUDGET, math.ceil(DEFAULT_SHARE * candidates))
        return min(total, candidates + 1)

    def __init__(self, data: PriorData | None = None):
        super().__init__()
        self._given = data

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self.data = self._given if self._given is not None else shared()
        self._designs: list[str] | None = None
        self._refresh()

    def _refresh(self) -> None:
        """The prior at this point from the data as it is now."""
        assert self.ctx is not None
        self._evidence = self.data.live_readings(self.ctx.problem)
        score, weight = self.data.predict(self.ctx.problem, self.space.index, len(self.space.candidates))
        if weight.any():
            score = self._smooth(score, weight)
        self.prior_mean = score if weight.any() else None
        ranked = np.argsort(score, kind="stable")
        self._prior_order = [int(i) for i in ranked if weight[i] > 0]

    def propose(self, n: int) -> list[Config]:
        # points searched at once (the parallel driver) learn from each other as their readings come
        assert self.ctx is not None
        if self.data.live_readings(self.ctx.problem) > REFRESH * max(self._evidence, 1):
            self._refresh()
        return super().propose(n)

    def _smooth(self, score: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Lend a config that few near sites measured the prior of its one-step neighbours: searched
        sites measured the good regions' cores, and a core's neighbour is seldom far off it."""
        w0 = SHRINK * weight.max()
        total, mass = score * (weight + w0), weight + w0
        out = score.copy()
        for i in np.flatnonzero(weight < w0 * SMOOTH_BELOW):
            nb = [j for j in self.space.neighbours(int(i)) if weight[j] > 0]
            if nb:
                out[i] = (total[i] + NEIGHBOUR * sum(weight[j] * score[j] for j in nb)) / (
                    mass[i] + NEIGHBOUR * sum(weight[j] for j in nb))
        return out

    # ---- designs: the search goes on around the best of every design in contention -----------------
    def design(self, i: int) -> str:
        """Candidate ``i``'s design (``KernelSpec.design``; one design without a spec)."""
        assert self.ctx is not None
        if self._designs is None:
            spec = self.ctx.spec
            self._designs = [spec.design(c) if spec is not None else "" for c in self.space.candidates]
        return self._designs[i]

    def contenders(self) -> dict[str, list[int]]:
        """The measured candidates of each design in contention (its fastest reads within ``CONTEND`` of
        the best), fastest first; designs in the order of their fastest. At a design boundary the
        runner-up design's best is as often one step from the winner as the leader's."""
        times = self.times()
        out: dict[str, list[int]] = {}
        if not times:
            return out
        order = sorted(times, key=times.__getitem__)
        best = times[order[0]]
        for i in order:
            d = self.design(i)
            if d in out:
                out[d].append(i)
            elif times[i] <= CONTEND * best:
                out[d] = [i]
        return out

    def model_pool(self) -> np.ndarray | None:
        """The model picks among the one-step neighbours, of a design in contention, of each contending
        design's ``TRUST`` fastest configs: with a few dozen readings its expected improvement over the
        whole space chases its uncertainty, into designs the readings already rule out."""
        rivals = self.contenders()
        if not rivals:
            return None
        near = np.zeros(len(self.space.candidates), dtype=bool)
        for members in rivals.values():
            for i in members[:TRUST]:
                near[[j for j in self.space.neighbours(i) if self.design(j) in rivals]] = True
        return near

    def local_moves(self, limit: int = 1) -> list[int]:
        """The polish takes turns over the designs in contention: each one's unmeasured neighbours of its
        fastest configs (whole neighbourhoods, ``limit`` at most per design, each in the prior's order),
        so a runner-up design's best gets its steps (a pipeline depth no similar point measured)."""
        queues = []
        for members in self.contenders().values():
            queue: dict[int, None] = {}
            for i in members:
                todo = self.unmeasured(self.space.neighbours(i))
                if self.prior_mean is not None:
                    todo.sort(key=lambda j: self.prior_mean[j])
                queue.update(dict.fromkeys(todo))
                if len(queue) >= limit:
                    break
            queues.append(list(queue))
        turns = (q[r] for r in range(max(map(len, queues), default=0)) for q in queues if r < len(q))
        return list(dict.fromkeys(turns))

    def observe(self, results: Sequence[Observation]) -> None:
        super().observe(results)
        assert self.ctx is not None
        self.data.add(self.ctx.problem, [o for o in results if o.key in self.space.index])

    def first_picks(self, used: int, total: int) -> list[int]:
        """After the warm starts: the prior's ranking for ``PRIOR_SHARE`` of the budget, and at least
        ``MIN_PRIOR`` of its first picks (a random sample when no near site measured any candidate)."""
        if not self._prior_order:
            return super().first_picks(used, total)
        share = math.ceil(PRIOR_SHARE * total)
        top = set(self._prior_order[:share])
        missing = MIN_PRIOR - sum(self.space.index.get(o.key) in top for o in self.history)
        if missing > 0:  # warm starts took the share (a budget of a few): the prior still gets its picks
            share = max(share, min(used + missing, share + MIN_PRIOR))
        if used >= share:
            return []
        return self.unmeasured(self._prior_order)[:share - used]

    def first_choices(self, n: int) -> list[str] | None:
        return [self.space.keys[i] for i in self._prior_order[:n]] if self._prior_order else None

    def upcoming(self, n: int) -> list[Config]:
        guess = self.unmeasured(self._prior_order[:n]) + [self.space.index[canonical_json(c)]
                                                           for c in super().upcoming(n)]
        return [self.space.candidates[i] for i in dict.fromkeys(guess)][:n]
