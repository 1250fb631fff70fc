"""Measure on several workers at once: one per GPU of this host (``--gpus``), or Ray actors (``--ray``).

The plain sweep searches one problem at a time on one GPU. :class:`ParallelSweep`
searches several problems at once, earliest first, so no worker idles while a
point waits for its default's result or its strategy waits for a batch. Strategies
that learn from results (:class:`~moetune.tuner.strategies.adaptive.AdaptiveStrategy`)
are asked for the same batches as in the plain sweep (``propose(BATCH)``, which
they cap at a quarter of their budget), each batch observed whole before the next,
so the search does not depend on how many GPUs run it; the others keep a sweep
batch in flight so compiles run ahead of the GPUs. A batch goes to the compile
workers longest compile first (:meth:`~moetune.specs.base.KernelSpec.compile_cost`), after
the strategy's first pick, so it does not wait on a slow compile started last, and
configs that share a binary (:meth:`~moetune.specs.base.KernelSpec.binary_key`) after the
first of them, so it is built once.

The sweep process stays the only writer of the store, so resume, claims and the
no-loss rule hold as on one GPU; workers only measure. A backend
(:class:`LocalBackend` here, :class:`moetune.tuner.ray_backend.RayBackend`) takes tasks
and hands results back as they finish, from whichever worker ran them.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo, interpreter_active
from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec
from moetune.tuner.runner import Runner, WorkerHandle, binary_id
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.strategies.adaptive import AdaptiveStrategy
from moetune.tuner.sweep import REMEASURE, Point, Sweep


# ---- choosing GPUs ---------------------------------------------------------------------------------------
def gpu_count() -> int:
    """CUDA GPUs this process sees (0 under the Triton interpreter)."""
    if interpreter_active():
        return 0
    import torch

    return torch.cuda.device_count()


def parse_gpus(text: str, count: int) -> list[int]:
    """``all`` or comma-separated indices of the ``count`` GPUs this host shows -> the indices, in order."""
    text = text.strip()
    if text.lower() == "all":
        if count < 1:
            raise ValueError("--gpus all: no CUDA GPU is visible on this host")
        return list(range(count))
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--gpus: {part!r} is not a GPU index (give all, or indices such as 0,1)")
        i = int(part)
        if i >= count:
            seen = f"GPUs 0..{count - 1}" if count else "no GPU"
            raise ValueError(f"--gpus: there is no GPU {i} on this host ({seen} visible)")
        if i in ids:
            raise ValueError(f"--gpus: GPU {i} is given twice")
        ids.append(i)
    return ids


def measure_task(spec: KernelSpec, problem: Problem, config: Config, seed: int,
                 timing: dict[str, Any] | None = None, best_ms: float | None = None) -> dict[str, Any]:
    """The task :func:`moetune.tuner.worker.handle` runs, the same one a plain :class:`Runner` sends.
    ``best_ms``: the point's best so far, which lets the worker time a far slower candidate briefly."""
    return {"mode": "measure", "kernel": spec.name, "spec_module": type(spec).__module__,
            "problem": problem, "config": dict(config), "seed": Runner.seed_for(problem, config, seed),
            "timing": dict(timing or {}), "best_ms": best_ms}


@dataclass
class WorkerState:
    """What the progress display shows per worker."""

    name: str
    where: str = ""
    counts: collections.Counter = field(default_factory=collections.Counter)
    current: str | None = None


def same_device(hellos: Sequence[dict[str, Any]], what: str) -> tuple[DeviceInfo, dict[str, str]]:
    """The one device kind all workers measure on (its constraints plan the search); RuntimeError if mixed."""
    names = sorted({h["device"]["name"] for h in hellos})
    if len(names) > 1:
        raise RuntimeError(f"{what}: the workers' GPUs differ ({', '.join(names)}); sweep one kind at a time")
    return DeviceInfo(**hellos[0]["device"]), hellos[0]["versions"]


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


# ---- the local backend: one worker per GPU -------------------------------------------------------------
BACKLOG = 64  # compiled candidates a GPU may always have waiting before the pool takes no more ...
BACKLOG_S = 20.0  # ... and beyond that, as long as they would keep it busy for less than this (seconds)


class LocalBackend:
    """One measuring worker process per device index of this host, fed from one queue.

    As in :class:`Runner`, candidates first compile on ``jobs`` processes (default: every core but
    the measurers' on a GPU, none on the interpreter; spread over the GPUs), while the GPUs measure
    what compiled before; one that fails, crashes or hangs there is final. Compiled ones go to
    whichever measuring worker is free. ``devices`` entries are torch
    device indices (one entry per measuring worker; an index given twice puts two on one GPU, whose
    timings then disturb each other); on the interpreter any index works (the workers all run on
    the CPU), which the tests use.
    """

    def __init__(self, devices: Sequence[int | None], *, timeout: float = 60.0, jobs: int | None = None,
                 timing: dict[str, Any] | None = None, log_dir: str | Path | None = None):
        if not devices:
            raise ValueError("--gpus: no GPU given")
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {timeout}")
        if jobs is not None and jobs < 0:
            raise ValueError(f"--jobs must be >= 0, got {jobs}")
        self.devices, self.timeout, self.jobs, self.timing = list(devices), timeout, jobs, dict(timing or {})
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="moetune-workers-") if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = [f"gpu{d}" if d is not None else f"w{i}" for i, d in enumerate(self.devices)]
        names = [f"{n}.{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]  # sharing a GPU
        self.measurers = [WorkerHandle(n, d, self.log_dir) for n, d in zip(names, self.devices, strict=True)]
        self.compilers: list[WorkerHandle] = []
        self.states = {h.name: WorkerState(h.name) for h in self.measurers}
        self.device: DeviceInfo | None = None
        self.versions: dict[str, str] = {}
        self._tasks: dict[Any, tuple[dict[str, Any], str]] = {}  # key -> (task, label), until its result
        self._compile_q: collections.deque = collections.deque()
        self._measure_q: collections.deque = collections.deque()
        self._prefetch_q: collections.deque = collections.deque()  # guessed tasks, compiled when idle
        self._prefetching: set = set()
        self._prefetch_ids = itertools.count()
        self._affinity: dict[str, tuple[Any, Any]] = {}  # compile worker -> the problem it compiled last
        self._bids: dict[Any, Any] = {}  # task key -> its binary (binary_id), until its result
        self.compile_busy = BusyClock()
        self.compile_tasks: list[tuple[float, float]] = []  # (wall s, CPU s) of each compile task
        self._measure_times: collections.deque = collections.deque(maxlen=64)  # recent tasks, seconds
        self._measure_start: dict[Any, float] = {}  # task key -> when a GPU took it

    @property
    def workers(self) -> list[str]:
        return [h.name for h in self.measurers]

    def launch(self) -> None:
        """Start every worker process without waiting for it (start() waits)."""
        if self.jobs is None:  # a GPU: every core but the measurers' compiles; the interpreter: none
            self.jobs = 0 if interpreter_active() else max(1, (os.cpu_count() or 1) - len(self.measurers))
        if len(self.compilers) != self.jobs:
            self.compilers = [WorkerHandle(f"compile{i}", self.devices[i % len(self.devices)], self.log_dir)
                              for i in range(self.jobs)]
        for h in self.measurers + self.compilers:
            if not h.alive:
                h.launch()

    def start(self) -> DeviceInfo:
        self.launch()
        self.device, self.versions = same_device([h.wait_ready() for h in self.measurers], "--gpus")
        for h in self.measurers:
            self.states[h.name].where = (f"{self.device.name} cuda:{h.device_index}" if self.device.is_gpu
                                         else "cpu (interpreter)")
        return self.device  # compile workers join as they come up (dozens import torch at once)

    def capacity(self) -> int:
        """Tasks it could take now. Without compile workers, one per measuring worker not yet given one.
        With them, one per compile worker with no binary to build (tasks sharing a binary count once: a
        tile's SPLIT_K variants build one), so compiles run ahead of the GPUs, up to ``BACKLOG``
        compiled candidates per GPU, or more while they would keep it busy under ``BACKLOG_S``
        seconds. Capping all tasks in flight at one per worker instead idled the compile workers
        whenever cached binaries made the GPU the bottleneck: the window filled with compiled
        candidates waiting for it, and what came next could not start compiling. A cap of 64 did the
        same at a larger scale: an exhaustive fp8 sweep on the H200 (7 ms a candidate) left its 15
        compile workers 33% and its GPU 43% idle (results/tuner.md, session 13), since a tile's other
        splits come later in the space's order and 64 cached candidates were 0.5 s of GPU work."""
        if not self.compilers:
            return max(0, len(self.measurers) - len(self._tasks))
        waiting = len(self._measure_q) / len(self.measurers)
        if waiting >= BACKLOG and waiting * self.measure_s() >= BACKLOG_S:
            return 0
        bins = [self._bids[k] for k in self._compile_q] + [h.binary for h in self.compilers if h.busy]
        pending = len({b for b in bins if b is not None}) + bins.count(None)  # None: a binary of its own
        return max(0, len(self.compilers) - pending)

    def measure_s(self) -> float:
        """Median seconds of the last measurements (a GPU's task, start to result); inf before any."""
        return statistics.median(self._measure_times) if self._measure_times else math.inf

    def submit(self, key: Any, task: dict[str, Any], label: str = "") -> None:
        self._tasks[key] = (task, label)
        self._bids[key] = binary_id(task)
        (self._compile_q if self.compilers else self._measure_q).append(key)
        self._dispatch()

    def _dispatch(self) -> None:
        """Start what can start: compiled candidates on free GPUs, queued compiles on free compile workers.

        Compiles only build binaries (warm-up launches, nothing runs on a GPU), so they go on while the
        GPUs measure, as in the plain :class:`Runner`; the queue of compiled candidates is what keeps
        every GPU busy."""
        for h in self.measurers:
            if not h.busy and self._measure_q:
                key = self._measure_q.popleft()
                task, label = self._tasks[key]
                h.submit(key, task, self.timeout)
                self._measure_start[key] = time.monotonic()
                self.states[h.name].current = label
        lock = str(self.log_dir / "inputs.lock")
        building = {h.binary for h in self.compilers if h.busy} - {None}
        for h in self.compilers:
            if h.busy or not (self._compile_q or self._prefetch_q):
                continue
            if not h.alive:  # killed by a candidate (or never launched): start again, use it once up
                h.stop()
                h.launch()
            if not h.ready:
                continue
            key = self._next_compile(h, building) if self._compile_q else None
            guess = None if key is not None else next(
                (g for g in self._prefetch_q if binary_id(g) not in building), None)
            if key is not None:
                task = self._tasks[key][0]
            elif guess is not None:  # nothing asked for (or only binaries being built): a guess ahead
                self._prefetch_q.remove(guess)
                task, key = guess, ("prefetch", next(self._prefetch_ids))
                self._prefetching.add(key)
            else:  # every queued binary is being built: the rest will find it in Triton's cache
                continue
            self._affinity[h.name] = (task.get("kernel"), task.get("problem"))
            h.submit(key, {**task, "mode": "compile", "lock": lock}, 2 * self.timeout)
            building.add(h.binary)

    def idle_compilers(self) -> int:
        """Compile workers with nothing to do once the queued compiles (asked and guessed) start."""
        return sum(not h.busy for h in self.compilers) - len(self._compile_q) - len(self._prefetch_q)

    def prefetch(self, task: dict[str, Any]) -> None:
        """Compile a candidate the search will likely ask for (Triton's cache keeps the binary) on a
        compile worker nothing else needs; nothing is measured or reported."""
        self._prefetch_q.append(task)
        self._dispatch()

    def _next_compile(self, h: WorkerHandle, building: set) -> Any:
        """The next compile task for ``h``: one of the problem it compiled last if queued (a compile
        worker keeps one problem's inputs, and making them is slow: a GB of weights), else the oldest;
        never one whose binary another worker is building (None if that leaves none)."""
        last, oldest = self._affinity.get(h.name), None
        for i, key in enumerate(self._compile_q):
            if self._bids[key] in building:
                continue
            task = self._tasks[key][0]
            if (task.get("kernel"), task.get("problem")) == last:
                del self._compile_q[i]
                return key
            oldest = i if oldest is None else oldest
        if oldest is None:
            return None
        key = self._compile_q[oldest]
        del self._compile_q[oldest]
        return key

    def poll(self, wait_s: float = 1.0) -> list[tuple[Any, dict[str, Any], str]]:
        """(key, result, worker) for every task that ended within ``wait_s`` seconds."""
        self._dispatch()
        busy = [h for h in self.compilers + self.measurers if h.busy]
        starting = [h.conn for h in self.compilers if h.hello is None and h.conn is not None]
        if not busy and not starting:
            return []
        left = min((h.deadline for h in busy), default=math.inf) - time.monotonic()
        wait([w for h in busy for w in h.waitables()] + starting, min(wait_s, max(0.0, left) + 0.01))
        done = []
        measurers = set(self.workers)
        for h in busy:
            got = h.collect()
            if got is None:
                continue
            key, res = got
            if h.name not in measurers and res.get("wall_ms") is not None:  # a compile worker's
                self.compile_busy.add(time.monotonic(), res["wall_ms"] / 1e3)
                self.compile_tasks.append((res["wall_ms"] / 1e3, res.get("cpu_ms", math.nan) / 1e3))
            if key in self._prefetching:  # a guess compiled (or not): nobody waits for it
                self._prefetching.discard(key)
                continue
            if h.name in measurers:
                self.states[h.name].current = None
                started = self._measure_start.pop(key, None)
                if started is not None:
                    self._measure_times.append(time.monotonic() - started)
            elif res["status"] == "ok":
                self._measure_q.append(key)  # compiled: on to a GPU
                continue
            else:
                res["reason"] = f"while compiling: {res.get('reason') or ''}".strip()
            self._tasks.pop(key)
            self._bids.pop(key, None)
            state = self.states.get(h.name)
            if state is not None:
                state.counts[res["status"]] += 1
            done.append((key, res, h.name))
        self._dispatch()
        return done

    def close(self) -> None:
        for h in self.measurers + self.compilers:
            h.stop()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalBackend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the driver ----------------------------------------------------------------------------------------
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


class BusyClock:
    """How busy a set of workers was: their task seconds over workers x (first task start .. last
    result). Measuring workers well under 1 waited for compiles: the sweep is bound by the CPU, not
    the GPUs. Compile workers well under 1 waited for work."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.span: tuple[float, float] | None = None

    def add(self, end: float, task_s: float) -> None:
        """A result received at ``end`` (monotonic seconds) whose task took ``task_s``."""
        self.busy_s += task_s
        start = end - task_s if self.span is None else min(self.span[0], end - task_s)
        self.span = (start, max(end, self.span[1]) if self.span else end)

    def fraction(self, workers: int) -> float | None:
        if self.span is None or workers < 1 or self.span[1] <= self.span[0]:
            return None
        return self.busy_s / (workers * (self.span[1] - self.span[0]))


class ParallelSweep(Sweep):
    """A :class:`Sweep` whose runner is a parallel backend (``capacity``/``submit``/``poll``/``workers``).

    ``prefetch``: idle compile workers compile what the strategies will likely propose next
    (:meth:`Strategy.upcoming`), when the backend can (``prefetch``/``idle_compilers``). Off by
    default: on two H200s (32 cores) it made a 6-point FP4 sweep slower, 99.7 vs 65.7 s on one GPU
    (results/multi_gpu_x2.md): the extra compiles slow the measuring workers' host work more than
    cached binaries save.
    """

    def __init__(self, *args: Any, prefetch: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prefetch = prefetch
        self.busy = BusyClock()

    @property
    def measuring_busy(self) -> float | None:
        """Share of the measuring workers' time spent on tasks (see :class:`BusyClock`)."""
        return self.busy.fraction(len(self.runner.workers))

    def compiling(self) -> dict[str, float] | None:
        """The compile workers' tasks, when the backend has them: how many, the share of the workers'
        time they filled, their median wall seconds and their CPU seconds over their wall seconds
        (well under 1: the tasks waited on something other than the compiler, e.g. the GPU)."""
        tasks = getattr(self.runner, "compile_tasks", None)
        if not tasks:
            return None
        wall, cpu = zip(*tasks, strict=True)
        share = sum(cpu) / sum(wall) if sum(wall) else math.nan
        return {"tasks": len(tasks), "busy": self.runner.compile_busy.fraction(len(self.runner.compilers)),
                "wall_s": statistics.median(wall), "cpu_share": share}

    def run(self, problems: Sequence[Problem] | None = None) -> list[Point]:
        if self.runner.device is None:
            self.runner.start()
        if problems is not None or not self.points:
            self.plan(problems or [], self.runner.device)
        elif self.runner.device != self.device:  # planned on the driver, measured elsewhere (a Ray cluster)
            self.plan([pt.problem for pt in self.points], self.runner.device)
        self.on_event("start", points=self.points, total=sum(self.expected(pt) for pt in self.points),
                      workers=self.runner.workers)
        self._deadline = None if self.time_limit is None else time.monotonic() + self.time_limit
        searches = [_Search(i, pt) for i, pt in enumerate(self.points)]
        inflight: dict[Any, tuple[_Search, Config]] = {}
        self._prefetched: set[tuple[int, str]] = set()
        try:
            while True:
                if not self._out_of_time():
                    self._fill(searches, inflight)
                    if self.prefetch and hasattr(self.runner, "prefetch"):
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
                for config in configs:
                    if s.finals is not None:  # re-measuring stored configs: no claim, a key per round
                        key = (s.index, canonical_json(config), REMEASURE, len(s.final_obs) + len(s.pending))
                    elif not self.store.claim(key_of, config, ttl, self.retry):
                        continue  # stored meanwhile, or another sweep on this store is measuring it
                    else:
                        key = (s.index, canonical_json(config))
                    inflight[key] = (s, config)
                    s.pending.add(key)
                    self.runner.submit(key, measure_task(pt.spec, pt.problem, config, self.seed,
                                                         getattr(self.runner, "timing", None), best),
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
                                           self._hints(s.index), self.budget, self.seed, pt.candidate_keys))
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
            if not s.pending:
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
        row = self._row(pt, config, res)
        final = len(key) > 2 and key[2] == REMEASURE
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


# ---- what the CLI builds -------------------------------------------------------------------------------
def make_runner(*, gpus: str | None = None, ray: bool = False, ray_address: str | None = None,
                ray_actors: int | None = None, ray_gpus_per_actor: float = 1.0, timeout: float = 60.0,
                jobs: int | None = None, timing: dict[str, Any] | None = None) -> tuple[Any, type[Sweep]]:
    """The measurement backend and the sweep driver for ``moetune sweep``'s options.

    ``--gpus`` puts one measuring worker on each GPU it names, one or several, and searches every
    point at once (:class:`ParallelSweep`), so compiles for some points overlap measuring others; no
    option does that on GPU 0 (1.8x faster than one point at a time for a 6-point FP4 sweep on an
    H200, results/multi_gpu_x2.md). Without a GPU (the interpreter) it is the plain :class:`Runner`
    and :class:`Sweep`, one point at a time.
    """
    if gpus is not None and ray:
        raise ValueError("--gpus and --ray exclude each other (Ray places its actors on GPUs itself)")
    if not ray and (ray_address is not None or ray_actors is not None or ray_gpus_per_actor != 1.0):
        raise ValueError("--ray-address, --ray-actors and --ray-gpus-per-actor need --ray")
    if ray:
        from moetune.tuner.ray_backend import RayBackend

        return RayBackend(address=ray_address, actors=ray_actors, gpus_per_actor=ray_gpus_per_actor,
                          timeout=timeout, jobs=jobs, timing=timing), ParallelSweep
    if gpus is None:
        if gpu_count() < 1:
            return Runner(timeout=timeout, jobs=jobs, timing=timing), Sweep
        gpus = "0"
    backend = LocalBackend(parse_gpus(gpus, gpu_count()), timeout=timeout, jobs=jobs, timing=timing)
    return backend, ParallelSweep


__all__ = ["LocalBackend", "ParallelSweep", "WorkerState", "gpu_count", "make_runner", "measure_task",
           "parse_gpus"]
