"""Replay: run a search strategy against stored exhaustive results, with no GPU.

Each stored point (kernel, device, shape, density, routing) is a closed world: its
candidates are the configs the exhaustive sweep measured there, and "measuring" one
is a lookup that returns the recorded status and a time drawn around the recorded
median with the recorded noise (log-normal, sigma = spread / 1.683, the p80-p20
width of a normal; ``noise`` scales it). Points of one op and shape are replayed in
density order like a sweep does, so each point gets the winners of the densities
before it as warm-start hints, after the spec's heuristic and what the other ops of
its kernel path found at the same density. As in a sweep, the shipped default is
measured first; then the strategy proposes batches until it stops; then its final
re-measurement (see :mod:`moetune.tuner.strategies.adaptive`). Every one of those counts
toward the budget. Quality is the recorded time of the declared winner over the
recorded exhaustive best (1.0 = found it).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moetune.problem import Config, Problem, canonical_json
from moetune.specs.registry import get_spec
from moetune.tuner.grid_budget import GridBudget, even_shares, first_pass, reading, second_pass
from moetune.tuner.replay_noise import RepeatNoise
from moetune.tuner.store import read_frame
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.strategies.prior import PriorData, PriorGuided, as_swept, model_key
from moetune.tuner.sweep import as_sibling_hint, family

POINT_COLUMNS = ("kernel", "device_name", "shape", "tokens", "routes", "active_fraction", "routing")
SPREAD_TO_SIGMA = 1.683  # (p80 - p20) of a standard normal


@dataclass
class RefPoint:
    """One exhaustively measured point: every candidate's recorded status, time and spread."""

    kernel: str
    device_name: str
    shape: dict[str, Any]
    tokens: int
    routes: int
    active_fraction: float
    routing: str
    configs: list[Config]
    status: list[str]
    time_ms: np.ndarray  # nan where not ok
    spread: np.ndarray
    default: Config | None = None
    arch: str = ""  # e.g. "sm_90": the spec's heuristic for it is the sweep's first warm start
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.index = {canonical_json(c): i for i, c in enumerate(self.configs)}

    @property
    def problem(self) -> Problem:
        return Problem(self.kernel, self.shape, self.tokens, self.routes, self.active_fraction, self.routing)

    @property
    def density(self) -> float:
        return self.routes / self.shape["E"]

    @property
    def best_ms(self) -> float:
        return float(np.nanmin(self.time_ms))

    @property
    def label(self) -> str:
        frac = "" if self.active_fraction == 1 else f" a{self.active_fraction:g}"
        return f"{self.kernel} {_shape_text(self.shape)} t{self.tokens} r{self.routes}{frac} {self.routing}"


def _shape_text(shape: dict[str, Any]) -> str:
    return ",".join(f"{k}={shape[k]}" for k in ("E", "N", "K", "top_k") if k in shape)


# ---- loading ------------------------------------------------------------------------------------------
def _as_swept(kernel: str, configs: pd.Series) -> pd.Series:
    """Stored configs as a sweep of today's spec would propose them (:func:`as_swept`), so rows from
    before and after a spec change meet as one candidate."""
    return configs.map(lambda c: as_swept(kernel, c))


def load_points(path: str | Path, kernels: Sequence[str] = (), min_candidates: int = 1,
                skipped: list[str] | None = None) -> list[RefPoint]:
    """The data's points (filtered by op name or family prefix), grouped by op and shape, by density.

    Points with fewer than ``min_candidates`` configs or no ok one (fragments of a cut sweep) are
    left out; their labels go to ``skipped``."""
    df = read_frame(path)
    missing = {*POINT_COLUMNS, "config", "status", "time_ms"} - set(df.columns)
    if missing:
        raise ValueError(f"--data: {path} lacks column(s) {sorted(missing)}")
    if kernels:
        keep = df["kernel"].map(lambda k: any(k == s or k.startswith(s + ".") for s in kernels))
        df = df[keep]
        if df.empty:
            raise ValueError(f"--kernel: no rows for {', '.join(kernels)} in {path}")
    if "spread" not in df.columns:
        df = df.assign(spread=0.0)
    ok = (df["status"] == "ok") & df["time_ms"].notna()
    df = df.assign(ok_time=df["time_ms"].where(ok), ok_spread=df["spread"].where(ok), ok=ok)
    swept = df.groupby("kernel", sort=False)["config"].transform(lambda c: _as_swept(c.name, c))
    df = df.assign(config=swept)
    points = []
    for key, g in df.groupby(list(POINT_COLUMNS), sort=False, dropna=False):
        point = dict(zip(POINT_COLUMNS, key, strict=True))
        per = g.groupby("config", sort=False).agg(
            ok=("ok", "any"), status=("status", "first"), time_ms=("ok_time", "median"),
            ok_spread=("ok_spread", "median"), spread=("spread", "median"))
        configs = [json.loads(c) for c in per.index]
        status = ["ok" if o else s for o, s in zip(per["ok"], per["status"], strict=True)]
        spread = per["ok_spread"].where(per["ok"], per["spread"]).fillna(0.0).to_numpy(dtype=float)
        shape = json.loads(point["shape"])
        spec = _spec_or_none(point["kernel"])
        default = None if spec is None else next((c for c in configs if c == spec.default), None)
        rp = RefPoint(point["kernel"], point["device_name"], shape, int(point["tokens"]),
                      int(point["routes"]),
                      float(point["active_fraction"]), point["routing"], configs, status,
                      per["time_ms"].to_numpy(dtype=float), spread, default,
                      str(g["arch"].iloc[0]) if "arch" in g.columns else "")
        if len(configs) < min_candidates or not np.isfinite(rp.time_ms).any():
            if skipped is not None:
                skipped.append(f"{rp.label} ({len(configs)} configs, {int(per['ok'].sum())} ok)")
            continue
        points.append(rp)
    if not points:
        raise ValueError(f"--data: no point in {path} has at least {min_candidates} configs with an ok one")
    points.sort(key=lambda p: (p.kernel, canonical_json(p.shape), p.routing, p.density, p.active_fraction))
    return points


# ---- budgets -------------------------------------------------------------------------------------------
def parse_budgets(text: str) -> list[str]:
    """"5%,10%,64" -> ["5%", "10%", "64"] (checked); a percentage is of each point's exhaustive count."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        GridBudget.parse(part, "--budget")  # the same spelling and checks as a grid budget
        out.append(part)
    if not out:
        raise ValueError("--budget: give at least one budget")
    return out


def budget_for(budget: str, point: RefPoint) -> int:
    if budget.endswith("%"):
        return max(1, math.ceil(float(budget[:-1]) / 100 * len(point.configs)))
    return int(budget)


# ---- one run -------------------------------------------------------------------------------------------
class Lookup:
    """Measurements at one point, answered from the data with fresh noise: the recorded spread scaled by
    ``noise``, or (``model`` given) the noise of repeated sweeps (:mod:`moetune.tuner.replay_noise`)."""

    def __init__(self, point: RefPoint, seed: int, noise: float, model: RepeatNoise | None = None):
        self.point, self.noise, self.model = point, noise, model
        self.rng = np.random.default_rng(zlib.crc32(f"{seed}|{point.label}".encode()))
        self.count = 0

    def measure(self, config: Config) -> Observation:
        i = self.point.index.get(canonical_json(config))
        if i is None:
            raise RuntimeError(f"strategy proposed a config that is not a candidate at {self.point.label}: "
                               f"{canonical_json(config)}")
        self.count += 1
        status, t, sp = self.point.status[i], self.point.time_ms[i], float(self.point.spread[i])
        if status != "ok":
            return Observation(config, status)
        if self.model is not None:
            return Observation(config, "ok", float(t * self.model.draw(self.rng, t / self.point.best_ms,
                                                                        self.noise)), sp)
        sigma = self.noise * sp / SPREAD_TO_SIGMA
        return Observation(config, "ok", float(t * math.exp(sigma * self.rng.standard_normal())), sp)


class PointSearch:
    """``strategy`` at ``point`` run like a sweep runs it: the default, then the strategy's batches up to
    its budget (:meth:`run`), then its final re-measurement (:meth:`finish`). A grid budget's first pass
    stops at ``budget`` a search planned for ``plan`` (``SearchContext.plan``); its second pass sets the
    budget anew (``strategy.set_budget``) and runs it again before it finishes.
    ``prior``: the data a ``prior`` search learns from (the committed stores when None)."""

    def __init__(self, point: RefPoint, strategy: str, budget: int, seed: int, batch: int = 1,
                 hints: Sequence[Config] = (), noise: float = 1.0, noise_model: RepeatNoise | None = None,
                 prior: PriorData | None = None, plan: int | None = None):
        if batch < 1:
            raise ValueError(f"--batch must be >= 1, got {batch}")
        self.point, self.name, self.batch = point, strategy, batch
        self.look = Lookup(point, seed, noise, noise_model)
        measured: list[Observation] = []
        if point.default is not None:
            measured.append(self.look.measure(point.default))
        self.strategy = PriorGuided(prior) if strategy == PriorGuided.name else get_strategy(strategy)
        self.strategy.start(SearchContext(_spec_or_none(point.kernel), point.problem, point.configs, measured,
                                          list(hints), budget, seed, plan=plan))
        self.seen = {o.key for o in measured}
        self.rounds = 0  # batches: a live sweep waits for each batch's compiles, so they set its wall time

    def run(self) -> None:
        """Propose and measure batches until the strategy stops (its budget spent)."""
        while proposal := self.strategy.propose(self.batch):
            self.rounds += 1
            if len(proposal) > self.batch:
                raise RuntimeError(f"{self.name} proposed {len(proposal)} configs for a batch of "
                                   f"{self.batch}")
            keys = [canonical_json(c) for c in proposal]
            if self.seen & set(keys) or len(set(keys)) != len(keys):
                raise RuntimeError(f"{self.name} proposed an already measured config at {self.point.label}")
            self.seen.update(keys)
            self.strategy.observe([self.look.measure(c) for c in proposal])

    def finish(self) -> dict[str, Any]:
        """The final re-measurement; the declared winner and the measurements made."""
        strat = self.strategy
        if hasattr(strat, "remeasure"):
            finals = strat.remeasure()
            self.rounds += bool(finals)
            strat.observe_remeasured([self.look.measure(c) for c in finals])
        winner = strat.winner() if hasattr(strat, "winner") else strat.best()
        chosen = math.inf if winner is None else float(self.point.time_ms[self.point.index[winner.key]])
        return {"measurements": self.look.count, "rounds": self.rounds,
                "winner": None if winner is None else winner.key, "winner_ms": chosen,
                "quality": chosen / self.point.best_ms}


def replay_point(point: RefPoint, strategy: str, budget: int, seed: int, batch: int = 1,
                 hints: Sequence[Config] = (), noise: float = 1.0, noise_model: RepeatNoise | None = None,
                 prior: PriorData | None = None) -> dict[str, Any]:
    """Run ``strategy`` at ``point`` like a sweep would (:class:`PointSearch`); its declared winner and
    the measurements made."""
    search = PointSearch(point, strategy, budget, seed, batch, hints, noise, noise_model, prior)
    search.run()
    return search.finish()


def _spec_or_none(kernel: str):
    try:
        return get_spec(kernel)
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Honesty:
    """What a replay lets a strategy know beyond the point it replays.

    ``holdout``: leave one model out: a ``prior`` search at a point learns from ``train`` less every site
    of the point's model (both ops of its layer: they hand each other warm starts), plus what this
    replay measures at the model's points. ``heuristic``: the spec's heuristic is the first warm start
    (off when it was derived from the data: it would hand the strategies the answer). ``warm``: the
    sweep's warm starts (other ops' and nearer densities' winners of this replay)."""

    holdout: bool = False
    heuristic: bool = True
    warm: bool = True
    train: PriorData | None = None  # None: the committed stores

    def describe(self) -> str:
        out = ["leave-one-model-out" if self.holdout else "no holdout",
               "heuristic " + ("on" if self.heuristic else "off"),
               "warm starts " + ("on" if self.warm else "off")]
        if self.train is not None:
            out.append(f"prior trained on {len(self.train.sites)} sites")
        return ", ".join(out)


def replay(points: Sequence[RefPoint], strategies: Sequence[str], budgets: Sequence[str], seeds: int,
           batch: int = 1, noise: float = 1.0, heuristic: bool = True,
           on_progress: Callable[[int, int, str], None] | None = None,
           honesty: Honesty | None = None, noise_model: RepeatNoise | None = None,
           grid: bool = False) -> pd.DataFrame:
    """One row per (strategy, budget, point, seed). Points of one op and shape run in density order,
    each getting the winners found at the earlier ones (nearest density first) as hints, after the
    spec's heuristic (see :class:`Honesty`; ``heuristic`` is its field when ``honesty`` is None).
    ``grid``: each budget is its model grid's (P% of all its points' evaluations, N: N for each of its
    points), spent in two passes as a sweep's grid budget (:mod:`moetune.tuner.grid_budget`): every
    point's first pass in that order, with the first passes' bests as the hints, then the second
    passes; the ``budget`` column reads "3% grid", ``extra`` and ``why`` say what the second pass gave.
    ``on_progress(done, total, label)``: before each point's run (each pass's, with ``grid``) and after
    the last."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if not strategies:
        raise ValueError("--strategy: give at least one strategy")
    for s in strategies:
        get_strategy(s)
    honesty = honesty or Honesty(heuristic=heuristic)
    train = honesty.train
    if PriorGuided.name in strategies and train is None and points:
        from moetune.tuner.strategies.prior import shared

        train = shared().without(lambda s: True)
    rows = []
    groups: dict[tuple, list[RefPoint]] = {}
    for p in points:
        groups.setdefault((p.kernel, p.device_name, canonical_json(p.shape), p.routing), []).append(p)
    total = len(strategies) * len(budgets) * seeds * len(points) * (2 if grid else 1)
    done = 0
    for strategy in strategies:
        for budget in budgets:
            first, plans, grids = _grid_plan(points, budget) if grid else ({}, {}, {})
            label = f"{budget} grid" if grid else budget
            for seed in range(seeds):
                won: dict[tuple, list[tuple[str, Config]]] = {}  # (path, density point) -> op winners
                priors: dict[str, PriorData] = {}  # per held-out model (one for all without a holdout)
                held: list[tuple[RefPoint, PointSearch]] = []  # after their first pass (grid)
                for group in groups.values():
                    found: list[tuple[float, Config]] = []
                    for p in group:
                        near = [c for _, c in sorted(found, key=lambda dc: abs(dc[0] - p.density))]
                        at = (family(p.kernel), p.device_name, p.tokens, p.routes, p.active_fraction,
                              p.routing)
                        start = _heuristic(p) if honesty.heuristic else []
                        hints = start + (_siblings(p, won.get(at, [])) + near if honesty.warm else [])
                        model = model_key(p.kernel, p.shape)
                        prior = None
                        if strategy == PriorGuided.name:
                            unit = model if honesty.holdout else ""
                            if unit not in priors:
                                priors[unit] = train.without(
                                    lambda s, m=unit: not m or model_key(s.kernel, s.shape) != m)
                            prior = priors[unit]
                        if on_progress is not None:
                            on_progress(done, total, f"{strategy} {label} seed {seed}: {p.label}")
                        done += 1
                        search = PointSearch(p, strategy, first[id(p)] if grid else budget_for(budget, p),
                                             seed, batch, hints, noise, noise_model, prior, plans.get(id(p)))
                        search.run()
                        if grid:
                            held.append((p, search))
                            best = search.strategy.best()
                            winner = None if best is None else best.key
                        else:
                            r = search.finish()
                            winner = r["winner"]
                            rows.append(_row(strategy, label, batch, seed, p, r))
                        if winner is not None:
                            found.append((p.density, json.loads(winner)))
                            won.setdefault(at, []).append((p.kernel, json.loads(winner)))
                second = _second_passes(held, first, grids)
                for p, search in held:
                    budget_now, more, why = second[id(p)]
                    search.strategy.set_budget(budget_now)
                    if on_progress is not None:
                        on_progress(done, total, f"{strategy} {label} seed {seed}, second pass: {p.label}")
                    done += 1
                    search.run()
                    rows.append(_row(strategy, label, batch, seed, p, search.finish(), more, why))
    if on_progress is not None:
        on_progress(done, total, "")
    return pd.DataFrame(rows)


def _row(strategy: str, budget: str, batch: int, seed: int, p: RefPoint, result: dict[str, Any],
         extra: int = 0, why: Sequence[str] = ()) -> dict[str, Any]:
    return {"strategy": strategy, "budget": budget, "batch": batch, "seed": seed, "point": p.label,
            "kernel": p.kernel, "model": model_key(p.kernel, p.shape), "density": p.density,
            "exhaustive": len(p.configs), "best_ms": p.best_ms, **result, "extra": extra,
            "why": ",".join(why)}


def _grid_plan(points: Sequence[RefPoint], budget: str
               ) -> tuple[dict[int, int], dict[int, int], dict[str, int]]:
    """``budget`` as each model grid's (P% of its points' evaluations, or N for each point): each point's
    first-pass budget and the even share its search plans for (by ``id``), and each grid's total."""
    members: dict[str, list[RefPoint]] = {}
    for p in points:
        members.setdefault(model_key(p.kernel, p.shape), []).append(p)
    first, plans, totals = {}, {}, {}
    for model, ps in members.items():
        sizes = [len(p.configs) for p in ps]
        grid = (GridBudget(share=float(budget[:-1]) / 100) if budget.endswith("%")
                else GridBudget(count=int(budget) * len(ps)))
        totals[model] = grid.total(sizes)
        first.update((id(p), share) for p, share in zip(ps, first_pass(sizes, totals[model]), strict=True))
        plans.update((id(p), even) for p, even in zip(ps, even_shares(sizes, totals[model]), strict=True))
    return first, plans, totals


def _second_passes(held: Sequence[tuple[RefPoint, PointSearch]], first: dict[int, int],
                   totals: dict[str, int]) -> dict[int, tuple[int, int, tuple[str, ...]]]:
    """Per point (by ``id``): its budget for the second pass, what its model grid's second pass added
    and why, from every point's first pass (:func:`grid_budget.second_pass`)."""
    members: dict[str, list[tuple[RefPoint, PointSearch]]] = {}
    for p, search in held:
        members.setdefault(model_key(p.kernel, p.shape), []).append((p, search))
    out = {}
    for model, ps in members.items():
        readings = [reading(p.problem, search.strategy, _spec_or_none(p.kernel), first[id(p)], len(p.configs))
                    for p, search in ps]
        extra, why = second_pass(readings, totals[model])
        out.update((id(p), (r.used + more, more, because))
                   for (p, _), r, more, because in zip(ps, readings, extra, why, strict=True))
    return out


def _heuristic(point: RefPoint) -> list[Config]:
    """The spec's heuristic at the point, if it is one of the point's candidates: a sweep measures it
    first among its warm starts (``Sweep._hints``), so a replay does too."""
    spec = _spec_or_none(point.kernel)
    if spec is None or not point.arch:
        return []
    config = spec.canonical({**spec.default, **spec.heuristic(point.shape, point.routes, point.arch)})
    return [config] if canonical_json(config) in point.index else []


def _siblings(point: RefPoint, winners: Sequence[tuple[str, Config]]) -> list[Config]:
    """What other ops of the point's kernel path found at its density, as its candidates (the sweep's
    sibling warm starts, ``Sweep._hints``)."""
    spec = _spec_or_none(point.kernel)
    if spec is None:
        return []
    out = [spec.canonical(as_sibling_hint(spec, c)) for k, c in winners if k != point.kernel]
    return [c for c in out if canonical_json(c) in point.index]


def _geomean(x: Iterable[float]) -> float:
    a = np.asarray(list(x), dtype=float)
    return float(np.exp(np.log(a).mean())) if len(a) else math.nan


def per_point(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, budget, point): measurements (of them, a grid budget's second pass: ``extra``) and
    the quality over seeds (geomean and worst)."""
    g = runs.groupby(["strategy", "budget", "point"], sort=False)
    return g.agg(exhaustive=("exhaustive", "first"), measurements=("measurements", "mean"),
                 extra=("extra", "mean"), rounds=("rounds", "mean"),
                 quality=("quality", _geomean), worst=("quality", "max"),
                 found=("quality", lambda q: float((q <= 1.0 + 1e-12).mean()))).reset_index()


def per_model(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, budget, model grid): the points, measurements and exhaustive evaluations summed
    over its points (mean over seeds), geomean quality over its points and the worst point."""
    pp = per_point(runs.assign(point=runs["model"] + " / " + runs["point"]))
    pp = pp.assign(model=pp["point"].str.split(" / ").str[0])
    out = []
    for (strategy, budget, model), g in pp.groupby(["strategy", "budget", "model"], sort=False):
        out.append({"strategy": strategy, "budget": budget, "model": model, "points": len(g),
                    "measurements": g["measurements"].sum(), "exhaustive": g["exhaustive"].sum(),
                    "quality": _geomean(g["quality"]), "worst_point": g["quality"].max()})
    return pd.DataFrame(out)


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, budget): share of the exhaustive measurements, geomean quality over the points,
    the worst point's quality, and how many points are within 5%."""
    pp = per_point(runs)
    out = []
    for (strategy, budget), g in pp.groupby(["strategy", "budget"], sort=False):
        out.append({"strategy": strategy, "budget": budget, "measurements": g["measurements"].mean(),
                    "rounds": g["rounds"].mean(),
                    "share": (g["measurements"] / g["exhaustive"]).mean(),
                    "quality": _geomean(g["quality"]), "worst_point": g["quality"].max(),
                    "within_5pct": f"{int((g['quality'] <= 1.05).sum())}/{len(g)}",
                    "found": g["found"].mean()})
    return pd.DataFrame(out)
