"""The one interface the sweep drivers and the CLI use to measure candidates, whatever runs them.

A backend starts worker processes (on this host, or Ray actors across a cluster), sends them
tasks and turns every way a task can end into a result. There are two ways of feeding one:

- :class:`SequentialBackend` (:class:`~moetune.tuner.backends.process.Runner`): the driver
  hands it one problem's batch and reads results as they finish (``measure``); it compiles
  ahead of its one measuring worker itself.
- :class:`PoolBackend` (:class:`~moetune.tuner.backends.local.LocalBackend`,
  :class:`~moetune.tuner.backends.ray.RayBackend`): the driver keeps it topped up with
  single tasks from every point at once (``capacity``/``submit``) and collects what ended
  (``poll``).

Everything else (start-up, worker states for the display, compile statistics, prefetching,
timing options, closing) is shared; what a backend does not have defaults to nothing here.
"""

from __future__ import annotations

import collections
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from moetune.device import DeviceInfo
from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec


def seed_for(problem: Problem, config: Config, seed: int) -> int:
    """A fresh input seed per candidate, the same on a rerun."""
    return zlib.crc32(f"{seed}|{problem.describe()}|{canonical_json(config)}".encode()) & 0x7FFFFFFF


def measure_task(spec: KernelSpec, problem: Problem, config: Config, seed: int,
                 timing: dict[str, Any] | None = None, best_ms: float | None = None) -> dict[str, Any]:
    """The task :func:`moetune.tuner.worker.handle` runs for one candidate, whichever backend sends it.
    ``best_ms``: the point's best so far, which lets the worker time a far slower candidate briefly."""
    return {"mode": "measure", "kernel": spec.name, "spec_module": type(spec).__module__,
            "problem": problem, "config": dict(config), "seed": seed_for(problem, config, seed),
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


class Backend(ABC):
    """What every measuring backend offers. Subclasses set ``timeout`` (seconds a candidate may take),
    ``timing`` (options every measurement task carries, :class:`~moetune.tuner.timing.TimingOptions`),
    and, once started, ``device`` and ``versions`` (what the store rows record)."""

    timeout: float
    timing: dict[str, Any]
    device: DeviceInfo | None = None
    versions: dict[str, str]
    # per measuring worker, what the live display shows; none for a backend with a single worker
    states: Mapping[str, WorkerState] = MappingProxyType({})

    def launch(self) -> None:
        """Start the worker processes without waiting for them (:meth:`start` waits), so they import
        torch and Triton while the sweep plans its space."""
        return None

    @abstractmethod
    def start(self) -> DeviceInfo:
        """Wait until the workers are up; the device they measure on."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker and remove what the backend made (its logs)."""

    @property
    def workers(self) -> list[str]:
        """Names of the measuring workers."""
        return list(self.states)

    def compiling(self) -> dict[str, float] | None:
        """The compile workers' tasks, where the backend counts them: how many, the share of the workers'
        time they filled, their median wall seconds and their CPU seconds over their wall seconds (well
        under 1: the tasks waited on something other than the compiler, e.g. the GPU)."""
        return None

    def idle_compilers(self) -> int:
        """Compile workers with nothing to do once the queued compiles start (0: nothing to prefetch on)."""
        return 0

    def prefetch(self, task: dict[str, Any]) -> None:
        """Compile a candidate the search will likely ask for on an idle compile worker (nothing is
        measured or reported); a backend that cannot does nothing."""
        return None

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SequentialBackend(Backend):
    """Measures a batch of one problem's candidates at a time (the plain
    :class:`~moetune.tuner.sweep.Sweep`)."""

    @abstractmethod
    def measure(self, spec: KernelSpec, problem: Problem, configs: Sequence[Config], seed: int = 0,
                admit: Callable[[Config], bool] | None = None,
                ahead: Sequence[Config] = (), best_ms: float | Callable[[], float | None] | None = None
                ) -> Iterator[tuple[Config, dict[str, Any]]]:
        """Yield (config, result) per candidate as each finishes; ``admit`` may skip one just before it
        runs; ``ahead``: the next batch, compiled meanwhile; ``best_ms``: the point's best so far (or a
        function telling it), so far slower candidates get fewer timed runs."""


class PoolBackend(Backend):
    """Takes single tasks from any point and hands results back as they finish, from whichever worker
    ran them (the :class:`~moetune.tuner.parallel.ParallelSweep` driver)."""

    @abstractmethod
    def capacity(self) -> int:
        """Tasks it could take now."""

    @abstractmethod
    def submit(self, key: Any, task: dict[str, Any], label: str = "") -> None:
        """Queue a task (:func:`measure_task`) under ``key``; ``label`` names it on the display."""

    @abstractmethod
    def poll(self, wait_s: float = 1.0) -> list[tuple[Any, dict[str, Any], str]]:
        """(key, result, worker) for every task that ended within ``wait_s`` seconds."""
