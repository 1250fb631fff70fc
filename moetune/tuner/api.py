"""The Python tuning API: :func:`tune` (what ``moetune sweep`` runs) and :func:`export_tables` (what
``moetune export`` runs). The CLI calls these with its options and draws their events (``moetune sweep``
through :func:`prepare`, which stops before measuring so it can print the plan first); a script gets
the same sweep, store and tables without the CLI's display::

    result = moetune.tune(model="deepseek-v3", kernels="fp8_decode", tokens=[1, 16], tp=8)
    result.best                        # one BestConfig per point
    moetune.export_tables(result.db, out="my-configs")

Bad input is a ValueError naming the option (the CLI's flag names), before a store or worker is touched.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.device import INTERPRETER, DeviceInfo, device_info
from moetune.problem import Config
from moetune.tables import picker
from moetune.tuner import factory
from moetune.tuner.export import ExportResult, export
from moetune.tuner.grid_budget import GridBudget
from moetune.tuner.problems import Plan, build_plan, resolve_kernels
from moetune.tuner.store import DEFAULT_PATH, Store, read_frame
from moetune.tuner.strategies import DEFAULT_STRATEGY, STRATEGIES, get_strategy
from moetune.tuner.strategies.adaptive import AdaptiveStrategy
from moetune.tuner.sweep import Point, Sweep, check_retry, load_starts, plan_points

if TYPE_CHECKING:
    import pandas as pd

    from moetune.tuner.backends.base import Backend

Progress = Callable[[int, int, str], None]  # on_progress(done, total, label of the item under way)


@dataclass
class BestConfig:
    """The fastest accurate config at one point (stored rows of earlier sweeps included)."""

    kernel: str
    shape: dict[str, Any]
    tokens: int
    routes: int
    active_fraction: float
    routing: str
    density: float
    config: Config | None  # None where nothing at the point was accurate
    time_ms: float | None
    default_ms: float | None
    speedup: float | None  # the default's time over the best's


@dataclass
class SweepResult:
    """What :func:`tune` measured: this sweep's rows (``sweep_id``) and the best config per point."""

    sweep_id: str
    db: Path
    rows: pd.DataFrame  # this sweep's measurements, as the store holds them
    best: list[BestConfig]
    points: list[Point]
    notes: list[str] = field(default_factory=list)
    timed_out: bool = False  # stopped by ``time_limit``; calling again resumes

    @property
    def written(self) -> int:
        return sum(sum(pt.counts.values()) for pt in self.points)

    @property
    def failures(self) -> list[str]:
        """Points stopped because the spec's own reference or input maker failed (nothing stored there)."""
        return [pt.failure for pt in self.points if pt.failure]


def _best(pt: Point) -> BestConfig:
    p = pt.problem
    return BestConfig(p.kernel, dict(p.shape), p.tokens, p.routes, p.active_fraction, p.routing, p.density,
                      dict(pt.best.config) if pt.best else None, pt.best.time_ms if pt.best else None,
                      pt.baseline.time_ms if pt.baseline and pt.baseline.ok else None, pt.speedup)


def _ints(values: int | Sequence[int] | None, cast: type = int) -> list:
    if values is None:
        return []
    return [cast(values)] if isinstance(values, (int, float)) else [cast(v) for v in values]


def _names(values: str | Sequence[str] | None) -> list[str]:
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


@dataclass
class Tuning:
    """A planned sweep, workers launched, store open, nothing measured yet (:func:`prepare`).

    :meth:`run` measures; :meth:`close` stops the workers and closes the store (always call it, or use
    the object as a context manager); :meth:`result` reads back what was measured. ``on_event`` receives
    the sweep's events (``start``, ``point``, ``result``, ``done``; see :mod:`moetune.tuner.sweep`).
    """

    plan: Plan
    device: DeviceInfo
    points: list[Point]
    sweep: Sweep
    runner: Backend
    store: Store
    db: Path
    strategy: str
    starts: list[Config]
    cross: bool = False
    on_event: Callable[..., None] | None = None
    startup: dict[str, float] = field(default_factory=dict)  # seconds after planning began, per step
    t_plan: float = 0.0

    def __enter__(self) -> Tuning:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _event(self, kind: str, **data: Any) -> None:
        if kind == "result" and "first result" not in self.startup:
            self.startup["first result"] = time.monotonic() - self.t_plan
        if self.on_event is not None:
            self.on_event(kind, **data)

    def run(self) -> None:
        """Start the workers, measure every point, then ``cross``; RuntimeError where a worker cannot start.
        Every result is in the store the moment it arrives, so an interrupt loses nothing."""
        self.sweep.on_event = self._event
        self.runner.start()
        self.startup["workers ready"] = time.monotonic() - self.t_plan
        self.sweep.run()
        if self.cross and not self.sweep.timed_out:
            self.sweep.cross()

    def close(self) -> None:
        try:
            self.runner.close()
        finally:
            self.store.close()

    def result(self) -> SweepResult:
        with Store(self.db, readonly=True) as store:
            rows = store.frame(sweep_id=self.sweep.sweep_id)
        return SweepResult(self.sweep.sweep_id, self.db, rows, [_best(pt) for pt in self.points],
                           self.points, list(self.plan.notes), self.sweep.timed_out)


def prepare(*, model: str | None = None, kernels: str | Sequence[str] | None = None,
            shape: str | dict | None = None, tokens: int | Sequence[int] | None = None,
            routes: int | Sequence[int] | None = None, active: float | Sequence[float] | None = None,
            routing: str | Sequence[str] = "uniform", tp: int = 1, ep: int = 1,
            db: str | Path = DEFAULT_PATH, budget: int | None = None,
            grid_budget: str | int | GridBudget | None = None, strategy: str | None = None,
            seed: int = 0, timeout: float = 60.0, jobs: int | None = None, time_limit: float | None = None,
            prefetch: bool = False, gpus: str | Sequence[int] | None = None, ray: bool = False,
            ray_address: str | None = None, ray_actors: int | None = None, ray_gpus_per_actor: float = 1.0,
            retry: str | Sequence[str] | None = None, full_timing: bool = False,
            starts: str | Path | Sequence[Config] | None = None, full_space: bool = False,
            cross: bool = False) -> Tuning:
    """Check everything, plan the points, launch the workers and open the store (:func:`tune`'s
    arguments). Every check comes before the store is opened, so bad input leaves it untouched."""
    device = device_info()
    plan = build_plan(_names(kernels), model=model, tp=tp, ep=ep, shape=shape, tokens=_ints(tokens),
                      routes=_ints(routes), active=_ints(active, float), routing=_names(routing),
                      device=device)
    strategy = strategy or DEFAULT_STRATEGY
    get_strategy(strategy)
    if budget is not None and budget < 1:
        raise ValueError(f"--budget must be >= 1, got {budget}")
    grid = sweep_budget(strategy, budget, grid_budget)
    if time_limit is not None and time_limit <= 0:
        raise ValueError(f"--time-limit must be positive, got {time_limit}")
    retries = check_retry(_names(retry))
    if starts is None:
        start_configs: list[Config] = []
    elif isinstance(starts, (str, Path)):
        start_configs = load_starts(starts)
    else:
        start_configs = [dict(c) for c in starts]
    if gpus is not None and not isinstance(gpus, str):
        gpus = ",".join(str(g) for g in gpus)
    runner, driver = factory.make_runner(gpus=gpus, ray=ray, ray_address=ray_address, ray_actors=ray_actors,
                                         ray_gpus_per_actor=ray_gpus_per_actor, timeout=timeout, jobs=jobs,
                                         timing={"slow_ratio": 0.0} if full_timing else None)
    runner.launch()  # worker processes import torch and Triton while the space is planned
    try:
        t_plan = time.monotonic()
        points = plan_points(plan.problems, device, full_space=full_space)
        startup = {"planned": time.monotonic() - t_plan}
        store = Store(db)
    except ValueError:
        runner.close()
        raise
    sw = driver(store, runner, strategy=strategy, budget=budget, seed=seed, time_limit=time_limit,
                retry=retries, starts=start_configs, full_space=full_space, prefetch=prefetch,
                grid_budget=grid)
    points = sw.plan(points, device)
    return Tuning(plan, device, points, sw, runner, store, Path(db), strategy, start_configs, cross,
                  startup=startup, t_plan=t_plan)


def sweep_budget(strategy: str, budget: int | None, grid_budget: str | int | GridBudget | None
                 ) -> GridBudget | None:
    """The grid budget a sweep spends: ``grid_budget`` as given, or (neither it nor a per-point ``budget``
    given) for a strategy that searches within a budget, its default grid share (``grid_share``) or else
    what its per-point defaults add up to, spent where the points disagree
    (:mod:`moetune.tuner.grid_budget`). None: per-point budgets."""
    if budget is not None and grid_budget is not None:
        raise ValueError("--budget (each point's) and --grid-budget (the sweep's) exclude each other")
    if isinstance(grid_budget, GridBudget) or grid_budget is None:
        if grid_budget is None and budget is None and issubclass(STRATEGIES[strategy], AdaptiveStrategy):
            return GridBudget(share=STRATEGIES[strategy].grid_share)
        return grid_budget
    return GridBudget.parse(grid_budget)


class _Log:
    """``quiet=False``: plain lines on stderr (the library stays free of rich): the plan, every tenth of the
    expected measurements, and each point's best at the end."""

    def __init__(self) -> None:
        self.total, self.done, self.step = 0, 0, 1

    def __call__(self, kind: str, **data: Any) -> None:
        if kind == "start":
            self.total = max(self.total, data["total"])  # a cross sub-sweep starts again, smaller
            self.step = max(1, self.total // 10)
            _say(f"{len(data['points'])} point(s), about {data['total']} measurement(s) to make")
        elif kind == "second_pass":
            flagged = sum(1 for pt in data["points"] if pt.extra)
            self.total += data["total"]
            _say(f"second pass: {data['total']} more measurement(s) at {flagged} of {len(data['points'])} "
                 "point(s), where neighbouring densities disagree")
        elif kind == "result":
            self.done += 1
            if self.done % self.step == 0:
                _say(f"{self.done}/{self.total} measured")
        elif kind == "done":
            for pt in data["points"]:
                b = _best(pt)
                best = "no accurate config" if b.config is None else f"best {b.time_ms:.4g} ms {b.config}"
                _say(f"{pt.problem.describe()}: {best}")


def _say(text: str) -> None:
    print(f"moetune: {text}", file=sys.stderr, flush=True)


def tune(*, model: str | None = None, kernels: str | Sequence[str] | None = None,
         tokens: int | Sequence[int] | None = None, routes: int | Sequence[int] | None = None,
         active: float | Sequence[float] | None = None, tp: int = 1, ep: int = 1,
         db: str | Path = DEFAULT_PATH, budget: int | None = None,
         grid_budget: str | int | GridBudget | None = None, strategy: str | None = None,
         gpus: str | Sequence[int] | None = None, seed: int = 0, quiet: bool = True,
         on_event: Callable[..., None] | None = None, **options: Any) -> SweepResult:
    """Tune kernel tiles at every point, as ``moetune sweep`` does; every measurement goes to ``db``.

    ``model`` is a preset name or a Hugging Face config.json (or ``shape=`` an explicit per-rank shape);
    ``kernels`` ops or families (default: the model's weight format); ``tokens`` (decode, with ``active``
    fractions) or ``routes`` (prefill) the densities (default: the CLI's grid); ``budget`` the most
    measurements at each point, or ``grid_budget`` ("5%" of all the points' candidates, or a count) for
    the whole sweep, spent in two passes (the default for ``prior``, ``model`` and ``coordinate``: what
    their per-point defaults add up to; docs/tuner.md, "The grid budget"); ``gpus`` "all" or GPU
    indices. The other options are the CLI's flags by their Python names: ``shape``, ``routing``,
    ``timeout``, ``jobs``, ``time_limit``, ``prefetch``, ``ray``, ``ray_address``, ``ray_actors``,
    ``ray_gpus_per_actor``, ``retry``, ``full_timing``, ``starts`` (a JSON file or configs), ``full_space``,
    ``cross``. A call repeated on the same ``db`` resumes: it measures only what is missing.
    ``quiet=False`` prints plain progress lines on stderr; ``on_event(kind, **data)`` gets every event.
    """
    tuning = prepare(model=model, kernels=kernels, tokens=tokens, routes=routes, active=active, tp=tp, ep=ep,
                     db=db, budget=budget, grid_budget=grid_budget, strategy=strategy, gpus=gpus, seed=seed,
                     **options)
    log = None if quiet else _Log()
    if log is not None:
        for note in tuning.plan.notes:
            _say(f"note: {note}")

    def events(kind: str, **data: Any) -> None:
        if log is not None:
            log(kind, **data)
        if on_event is not None:
            on_event(kind, **data)

    tuning.on_event = events
    with tuning:
        tuning.run()
    return tuning.result()


def export_tables(db: str | Path | Sequence[str | Path] = DEFAULT_PATH, out: str | Path | None = None, *,
                  kernels: str | Sequence[str] | None = None, device: str | None = None,
                  arch_device: str | None = None, allow_interpreter: bool | None = None,
                  on_progress: Progress | None = None) -> ExportResult:
    """Write the best accurate config per (device, shape, density) of one store or several pooled into
    tables under ``out`` (default: the packaged tables), as ``moetune export`` does.

    Interpreter (CPU) results, whose times are meaningless, are a ValueError unless ``allow_interpreter``,
    which defaults to True only where ``out`` is given (a tree of your own, e.g. a ``MOETUNE_CONFIG_DIR``).
    ``on_progress(done, total, label)`` is called per (kernel, shape, device) table.
    """
    names = _names(kernels)
    dbs = [db] if isinstance(db, (str, Path)) else list(db)
    if allow_interpreter is None:
        allow_interpreter = out is not None
    if out is None:
        out = picker.PACKAGED
    where = "the packaged tables" if Path(out) == picker.PACKAGED else "the tables"
    if not allow_interpreter:
        n = interpreter_rows(dbs, names, device)
        if n:
            raise ValueError(f"{n} of the rows to export were measured on the Triton interpreter (CPU; times "
                             f"are meaningless): not writing them into {where} {out}; give --out DIR, "
                             "--device, or --allow-interpreter")
    return export(dbs, out, kernels=names, device=device, arch_device=arch_device, on_progress=on_progress)


def interpreter_rows(dbs: Sequence[str | Path], kernels: Sequence[str], device: str | None) -> int:
    """How many rows an export would read that the Triton interpreter measured (arch "interpreter")."""
    ops = {s.name for s in resolve_kernels(kernels)} if kernels else None  # unknown names: ValueError
    count = 0
    for path in dbs:
        frame = read_frame(path, "--db")
        if device is not None:
            frame = frame[frame["device_name"] == device]
        if ops is not None:
            frame = frame[frame["kernel"].isin(ops)]
        count += int((frame["arch"] == INTERPRETER.arch).sum())
    return count
